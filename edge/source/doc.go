// Package source brings upstream messages down into a node's log (cloud
// to edge): the other direction of package sink. A source subscribes to
// an upstream (an MQTT broker, a Kafka cluster, another Peat) and appends
// what it receives to one local stream, from which delivery to local
// subscribers, retained messages and the site's replication follow as for
// any publish: a source only appends.
//
// The framework (this package) owns a source's name, config, state,
// metrics, pause, placement in a site and reconnect backoff; a kind of
// upstream (a subpackage: mqttsource, kafkasource, peatsource) owns the
// protocol, behind Upstream and Conn:
//
//	upstream ──► Conn.Next ──► append to the stream ──► committed ──► Conn.Done ──► ack upstream
//
// The rule that makes it safe: a message is acknowledged upstream only
// once its record is committed here. What a crash costs at each point:
//
//   - before the append is committed: nothing is stored and nothing was
//     acknowledged; the upstream delivers the message again.
//   - after the commit, before the acknowledgement: the record is
//     stored, and the upstream delivers it again. Whether that is a
//     duplicate is the kind's to decide, from the position it wrote in
//     its records (Message.Record's user properties), which is durable
//     in the same append as the record: Resume.Scan finds the newest.
//     MQTT QoS 1 stores such a redelivery again (at most the window of
//     messages in flight repeats); MQTT QoS 2 recognises it by its
//     packet id and only acknowledges it; Kafka resumes after the
//     offset of its newest record and fetches nothing twice.
//   - after the acknowledgement: the upstream has let the message go;
//     the log holds it.
//
// Order: records are appended in the order Next returned them, one batch
// after another, and Done sees the batches in that same order, so a
// kind's acknowledgements keep the upstream's order (MQTT requires it).
// A failed append ends the connection; nothing after it is acknowledged.
//
// Every record gets user properties naming where it came from:
// peat-source (the source's name) and peat-origin (the upstream, as a
// sink to the same place names itself). A sink skips records whose origin
// is its own upstream, so a sink and a source on one upstream with
// overlapping topics do not loop.
//
// A kind may acknowledge a message without storing it: Record nil is a
// redelivery the log already holds (counted as a duplicate), or, with
// Drop naming why, a message it refuses ("echo": one this node's own sink
// sent up, marked with PropSink).
//
// Before each connection the framework waits until the previous
// connection's appends are all told, and, for a LogEnder (in a site, a
// new leader whose watermark does not yet cover the records its
// predecessor appended), until the stream's watermark reaches its log
// end: Resume then sees every record stored before.
//
// A source writes one stream (Config.Stream, by default the stream that
// captures its mapped topics): that stream's leader runs it in a site,
// and its records there are the source's position. A message whose
// mapped topic another stream captures is dropped, counted and logged,
// and acknowledged (it can never be stored here; holding it would stop
// the source).
//
// Pause closes the connection: an upstream with a persistent session
// keeps what arrives meanwhile, and Resume dials again. The states are
// connecting, connected, stalled (messages are waiting to be durable, or
// the connection reports a lag, and nothing became durable for
// StallAfter), paused, and standby (in a site, another node leads the
// stream and runs the source).
//
// Wiring (edge): edge/config_sources.go holds SourceConfig, the `sources:`
// entries, with one block per kind (mqtt, kafka, peat) and the fields the
// framework owns (name, stream, backoff, stall_after). Each kind's block
// is a type in edge (SourceMQTTConfig in config_sources.go,
// SourceKafkaConfig and SourcePeatConfig in files of their own) with two
// methods, validate(field string) error and upstream(name string)
// (source.Upstream, error), which is all edge/sources.go needs to run it.
package source
