// Package peatsink is the Peat sink: it mirrors a node's streams into
// another Peat, each into a mirror stream there that keeps the source's
// offsets (edge/mirror is the receiving side, with the rules).
//
// It is the MQTT sink (edge/sink/mqttsink) with fixed settings: MQTT 5,
// QoS 1, a persistent session, topic $mirror/<mirror_as> ({stream} and
// {node} replaced), and after the record's own user properties the sink's
// (peat-topic is the record's topic through the topic template):
// peat-stream, peat-offset, peat-time, peat-topic, peat-client, peat-qos,
// peat-expiry and peat-first (the source stream's log start when the record
// is sent). So the sink framework (edge/sink) gives it what it gives every
// sink: the position as a consumer group, a window no larger than the
// other Peat's Receive Maximum, reconnects with backoff, health.
//
// Across a crash of either side the sink sends again from its durable
// position (at most a window and a commit batch of records twice: see
// package sink); the mirror acknowledges
// those without appending. When retention dropped records before they were
// sent, the sink goes on from the log start (logged and counted as lost, as
// for every sink) and the mirror marks the missing offsets, since
// peat-first shows the source no longer has them. A record that arrives
// after a gap the source could still fill is refused, and the sink sends
// again from its position: a mirror never has a hole the source has not.
//
// So a peat sink sends whole streams: a filter, or a start other than
// earliest, would skip records the source still has, and the mirror would
// refuse what follows; the config refuses both. Moving the sink's position
// forward by hand (Broker.CommitGroup) is refused the same way
// by the mirror (the sink reports the refusal and stalls).
package peatsink
