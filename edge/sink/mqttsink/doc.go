// Package mqttsink is a sink.Upstream for any MQTT broker (3.1.1 or 5),
// written on mochi's packet codec: a client with no queue of its own, so
// the log stays the only buffer.
//
// It publishes with QoS 1 or 2 on a persistent session (clean start off;
// MQTT 5 Session Expiry Interval one day) and keeps at most the window of
// PUBLISHes unacknowledged: the configured window, lowered to an MQTT 5
// upstream's Receive Maximum. A PUBACK with a failure code (MQTT 5), a
// DISCONNECT, or a connection that brought nothing back for a keepalive
// (PINGREQ goes every half keepalive) ends the connection; the sink then
// reconnects with backoff and sends again from its durable position. A
// refused record is never skipped: the sink stays stalled and says why.
//
// Sending is written for drains of large backlogs: each PUBLISH is
// encoded by hand straight into the connection's write buffer (encode.go:
// mochi's bytes, without its per-packet buffers and copies), a turn of
// the pump goes out in one write, acknowledgements reach the pump in
// groups of a quarter window (sink.Batch: it acts on no fewer; the last
// one in flight goes at once), so peat_sink_ack_latency_seconds includes
// that wait, and on Linux each read is acknowledged
// at once (TCP_QUICKACK). An upstream with Nagle's algorithm on, as
// Mosquitto has by default, otherwise holds every PUBACK after the first
// until its segment is acknowledged, which Linux delays up to 40 ms while
// the sink's full window gives it nothing to send: a drain of one window
// per 40 ms.
//
// Topics come from a template with {topic} (the record's topic), {stream}
// and {node}. MQTT 5 PUBLISHes carry the record's own properties (content
// type, payload format, response topic, correlation data, user
// properties, what is left of its expiry) and, with Properties, the user
// properties peat-stream, peat-offset and peat-time (unix ms).
//
// QoS 1: every connection starts from the sink's durable position, so a
// reconnect sends up to the window again. QoS 2: the packet ids in flight
// (and, until PUBREC, the encoded PUBLISH) live in the Upstream's session,
// which outlives connections. When the upstream reports the session
// present, the new connection sends PUBREL for what it has received and
// the PUBLISH with DUP for the rest, under the same ids, and tells the
// sink (sink.Keeper) to keep its window: nothing arrives twice. The first
// connection of a process clears the upstream session first (clean start,
// then DISCONNECT): packet ids the broker still holds from before a crash
// would otherwise swallow new PUBLISHes as duplicates. So across a restart
// QoS 2 is at least once, with repeats bounded by the window and a
// commit batch (package sink).
package mqttsink
