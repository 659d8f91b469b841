// Package sink sends a node's streams upstream (edge to cloud) with
// store-and-forward: the log itself is the buffer.
//
// A sink is a consumer group of each stream it sends, named
// "$sink.<name>" (a group whose name starts with $, which no MQTT client
// can consume, read or commit; a commit from inside the node is a seek,
// which the pump follows when its Positions is a Watcher).
// Its position in a stream is the offset below which every record was
// acknowledged upstream or skipped by the sink's topic filter. The sink
// reads "everything after my position" from the log, so an outage of any
// length costs disk (bounded by the stream's retention), never memory: the
// only records in memory are the in-flight window and a read-ahead of at
// most 256 records (or ReadBytes) per stream.
//
// One goroutine, the pump, owns a connection (Conn) at a time:
//
//	read from next ──► Send ──► upstream
//	                              │ acks (any order)
//	position ◄── commit ◄── contiguous acknowledged prefix
//
// The window is min(configured window, what the upstream allows: an MQTT 5
// Receive Maximum), and it bounds the records sent and not acknowledged.
// The position moves over the contiguous acknowledged prefix and is
// committed (durably, through Positions) once a commit batch is
// acknowledged: a quarter of the window, at least 256 records
// (commitBatchOf), or sooner when the sink has caught up with everything
// acknowledged, or a second after the last commit, or when the
// connection ends. Records sent and not under the durable position are
// at most the window plus a commit batch (acknowledged records above an
// unacknowledged one wait there too). So after a crash the sink starts
// again from the durable position and sends at most that many records
// twice, after a dropped connection at most the window; the upstream
// sees each stream in order, with duplicates only as such a rewind.
//
// Why a commit batch apart from the window: each commit is a state
// write, and under fsync durability every Badger write is fsynced (the
// option is database-wide). Committing a quarter window at a time, five
// records behind Mosquitto's Receive Maximum of 20, cost more CPU than
// the rest of the drain (BenchmarkDrain with DRAIN_DURABILITY=fsync: 47
// against 20 µs a record on a loaded machine; 23 with commit batches).
//
// The pump reads from the log a quarter of the window at a time (or as
// soon as everything sent is acknowledged): acting on each
// acknowledgement alone cost a log read and a socket write per record. A
// read asks for up to 256 records beyond that (ReadBytes bounds it), kept
// in the cursor until sent: the log stores records in group-commit
// batches, and every read parses the batches it touches whole. Anything
// that moves the cursor (a reconnect, a seek, a leader change) drops what
// was read ahead.
//
// Every connection starts from the durable position: a reconnect needs no
// new traffic to drain the backlog. Retention may drop records the sink
// has not sent: the range is logged at ERROR and counted in
// peat_sink_lost_records_total, and the sink continues from the log start.
//
// Health comes from acknowledged progress, not from the socket: a stream
// with records to send and nothing acknowledged for StallAfter is stalled,
// connected or not (a black hole keeps a socket open and passes nothing).
// The states are connecting, connected, stalled and paused; Status and the
// peat_sink_* metrics report them per stream.
//
// A sink sends the streams it was made with, and those AddStream gives it
// while it runs (edge follows the store's streams: all of them for a sink
// of "*", the named ones otherwise, so a named stream removed and created
// again is sent again); RemoveStream stops one, forgetting what of it was
// in flight. The pump takes the list afresh on each turn.
//
// The monitor alone writes the gauges, once a tick, and deletes series
// nobody updates any more, so no scrape shows a value frozen in the past:
// a stream the sink stopped sending loses all its series (counters
// included), a sink whose Run ended loses all of its own, and a stream on
// standby has no last-success series (the leader's acknowledgements are
// newer; one comes back with the first acknowledgement after this node
// leads it again).
//
// In a site (Config.Leadership) a sink sends a stream only while its node
// leads the stream: that node's log is the site's, its watermark is the
// site's commit point (Read serves records below it only, so nothing a
// leader change could still truncate and replace goes upstream), and the
// position, a consumer group, is written through it to the stream's ISR.
// Taking a stream up (lead.go), the sink loads the position afresh from
// Positions (the last one any node committed) and, for a Resumer, asks
// the upstream; losing it, it forgets what it had in flight and commits
// nothing more there, so the two leaders of a failover overlap by at most
// the window, as a crash does. A leader that may have been deposed
// without knowing it (a Holder: in a site, cut off from the controller)
// holds: it sends nothing new but keeps its connection and window. A node
// that leads none of a sink's streams
// holds no connection upstream; Status shows such streams as standby with
// the node that leads them, never stalled, and no lag of its own. A new
// leader whose watermark is still below the position its predecessor
// committed waits for it (uncommitted) rather than moving it back.
//
// No echo: an Upstream that is an Originer names itself as a source of
// the same place does (edge/source: mqtt://host:port for an MQTT broker),
// and the pump skips the records whose peat-origin user property is that
// name, as it skips those the filter leaves out (the position moves past
// them; peat_sink_echo_skipped_records_total counts them): what a source
// brought down from an upstream never goes back up to it.
//
// Kinds of upstream live in subpackages, one each, like litestream's
// replica clients: mqttsink (any MQTT 3.1.1 or 5 broker), kafkasink
// (franz-go) and peatsink (another Peat, into mirror streams that keep the
// source's offsets: edge/mirror). A Conn may also be a Keeper (MQTT QoS 2: it completes its
// predecessor's deliveries, so the pump keeps its window) or a Resumer
// (Kafka exactly-once: the upstream's own tail says where to resume, so
// the position moves past what it already holds, once its last record
// proves to be the stream's record at that offset: Held, holdsOwn).
package sink
