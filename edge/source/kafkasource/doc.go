// Package kafkasource is a source.Upstream for Kafka, on franz-go: it
// brings Kafka topics down into a local stream exactly once, with no
// consumer group and nothing stored anywhere but the log.
//
// The source assigns itself every partition of its topics (no group
// membership, no coordinator) and reads committed records only unless
// told otherwise (isolation level read_committed: records of aborted
// transactions never arrive, and commit markers take offsets the source
// steps over). Each Kafka record becomes one record of the stream, its
// MQTT topic from the template ({topic}, {partition}, {key},
// {header:NAME}), its headers as MQTT 5 user properties (UTF-8 ones),
// then its position:
//
//	peat-source-kafka-topic      the Kafka topic
//	peat-source-kafka-partition  its partition
//	peat-source-kafka-offset     the record's offset there
//	peat-source-kafka-next       last record of a batch only: every
//	                             partition's next offset once the batch
//	                             is stored, "t/0=12,t/1=40"
//
// The position is in the record, so it is in the same append (the same
// Badger batch) as the record, and in a site replicated with it: no
// checkpoint can say more or less than the log holds. At each connect
// (a start, a reconnect, a failover to another node of the site) Resume
// first waits until every record the stream holds is committed (a new
// leader may hold records of its predecessor the ISR does not hold yet;
// resuming before them would fetch them again), then scans the source's
// records newest first, down to the newest record
// with peat-source-kafka-next: that one names every partition, and the
// records after it, stored after it, move theirs on. The scan is bounded
// by the source's mark (source.Resume.Mark), the offset of a batch's
// last record, moved there about once a second once that record is
// committed; it is only where the scan may stop, never a position
// itself. A partition the log holds nothing of starts at Start (earliest
// or latest, resolved to an offset at once and written with the first
// batch, so a restart does not resolve it again).
//
// Batches go one at a time: the next is fetched only once the one before
// is stored (Conn.Done). A batch whose append failed is then the last
// the connection hands out, so no later batch can be stored after it and
// say its records are too. What a kill -9 costs: records fetched and not
// stored are fetched again; records stored and not yet known stored
// (Done) are in the log, and the scan finds them: no duplicate, no gap.
//
// A record whose template gives no valid topic (empty, a wildcard, NUL,
// a leading $) is skipped and logged: a restart reads and skips it again,
// so it is never stored. One whose topic another stream captures is
// dropped by the framework the same way. Records Kafka's retention
// deleted before the source read them are logged at ERROR (franz-go's
// data loss) and the partition goes on from Kafka's log start.
//
// Group, when set, receives the durable positions every few seconds
// (an offset commit outside any group membership), so Kafka's lag tools
// show the source; the source never reads it back. Lag (source.Lagger)
// is the sum over partitions of the end the last fetch reported (the
// last stable offset under read_committed) less the stored position.
//
// A record the stream refuses (larger than its record limit, a full
// disk) ends the connection, and the next one fetches it again: the
// source stalls and says why rather than skip it.
//
// Limits: a source consumes whole topics (all partitions); if retention
// here dropped every record of the source, its position is gone with
// them and it starts again at Start.
package kafkasource
