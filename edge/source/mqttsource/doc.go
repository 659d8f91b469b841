// Package mqttsource is a source.Upstream for any MQTT broker (3.1.1 or
// 5), written on mochi's packet codec like the MQTT sink
// (edge/internal/mqttclient holds what they share).
//
// It keeps a persistent session upstream (clean start off; MQTT 5
// Session Expiry Interval one day) under its client id, subscribes to
// its filters each with its QoS, and turns each PUBLISH into a record:
// the topic with Strip cut from its start and put into the Topic
// template ({topic}), the payload, QoS and retain flag as they came (MQTT
// 5 subscriptions ask for Retain As Published, so a retained message
// stays retained here), the MQTT 5 properties (content type, payload
// format, response topic, correlation data, user properties, message
// expiry), ClientID the source's client id, and, for QoS 1 and 2, the
// packet id in the user property peat-source-mqtt-pid.
//
// Acknowledgements wait for the log (source.Conn.Done): PUBACK for QoS 1
// and PUBREC for QoS 2 go upstream only once the record is committed
// here, so the upstream keeps every message the node may not have; it
// announces a Receive Maximum (MQTT 5) to bound what waits.
//
// QoS 1 is at least once: a message stored and not yet acknowledged when
// the connection or the node dies comes again and is stored again (at
// most the messages in flight, the Receive Maximum, repeat, from an
// upstream that keeps it; Mosquitto before 2.0.13 does not).
//
// QoS 2 is exactly once, across reconnects and crashes, by MQTT's own
// rule (method B: a receiver holds a packet id from PUBLISH to PUBREL):
// the records carry their packet ids, and the source's mark (a consumer
// group of its stream, "$source.<name>") is the offset below which every
// record was released. A PUBREL moves the mark past its record, durably,
// before its PUBCOMP goes out (one write for every PUBREL waiting):
// only after PUBCOMP may the upstream reuse the id. On connecting, the
// source reads its records above the mark: their ids are open, and a
// PUBLISH with an open id is a redelivery of a message the log holds, so
// it is acknowledged again and not stored. PUBRELs come in the order of
// the PUBRECs, which is the records' order, so a release releases the
// records before it too. An upstream that reports no session present
// (expired, or a broker without persistence restarted) has forgotten
// every id: the mark moves to the stream's end. In a site the mark and
// the records are replicated with the stream, so a new leader resumes
// with the same knowledge.
//
// Subscriptions: an MQTT 5 upstream is asked on every connection, with
// Retain Handling 1 (retained messages only for a new subscription) and
// No Local (which matters only for a connection that also publishes; a
// record's peat-origin, not No Local, keeps a sink from echoing it); a
// 3.1.1 upstream only when it has no session, or on the first connection
// of a process (the filters may have changed), since asking again would
// bring its retained messages again. A refused filter (SUBACK failure)
// ends the connection with the reason, in last_error.
//
// A PUBLISH larger than MaxPacket: an MQTT 5 upstream is told not to send
// one (Maximum Packet Size); from a 3.1.1 upstream it ends the connection.
package mqttsource
