// Package kafkasink is a sink.Upstream for Kafka, on franz-go.
//
// Records go to the topic the template names ({stream}, {node}; default
// "peat.{stream}"), keyed by the key template ({topic}, {stream}, {node};
// none by default), with the headers peat-site, peat-stream, peat-offset,
// peat-time (unix ms) and peat-topic, then the record's MQTT 5 user
// properties. The producer is idempotent (acks from all in-sync replicas)
// and holds at most the window of records (MaxBufferedRecords).
//
// With ExactlyOnce the producer is transactional (id
// "peat.<site>.<sink>"): each window of records is one transaction, and
// the sink acknowledges them only once it commits. On every connection,
// and before the first send of a stream the sink takes up while connected
// (added to a sink of every stream, or, in a site, led here from now on),
// Resume reads the end of each partition of the stream's topic (read
// committed; a window of offsets before the end, because commit markers
// take offsets too) and returns the offset after the highest peat-offset
// this site wrote there; the sink moves its position there. Since a
// transaction commits all its partitions or none, every earlier record is
// in the topic too: a crash between Kafka's commit and the sink's own
// position (kill -9) sends nothing twice. The sink moves only when that
// record's peat-time and peat-topic are the stream's record at that
// offset (sink.Held): a stream deleted and created again under the same
// name, whose offsets start anew, is sent from the sink's own position
// instead of skipping its records. Creating the transactional
// client fences a predecessor with the same id and aborts its open
// transaction.
//
// In a site every node has its own id (Instance: the node id appended),
// since nodes leading different streams of the sink produce at once, and
// all write the same peat-site (the site's name by default), so a new
// leader's Resume finds what the old one committed. An old leader's
// transaction still open is invisible to Resume (read committed) and
// aborted by Kafka after its timeout if the old leader died; one the old
// leader commits after the new leader's Resume (it had not yet heard that
// it lost the stream) is sent twice: at most a window, at least once. If other producers wrote more than the tail window to a
// partition after this site's last transaction, Resume finds nothing
// there and the sink falls back to its own position (at least once).
package kafkasink
