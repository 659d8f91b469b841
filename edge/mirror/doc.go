// Package mirror is the receiving side of the Peat sink (edge/sink/peatsink):
// a mirror stream holds another Peat's stream at that stream's offsets.
//
// A mirror stream is configured with mirror: true. Its filters say what
// readers reach it by ($replay, $group), as for any stream, but a publish
// they route to it is refused (mqtt ingest, PUBACK 0x90): a mirror's
// offsets belong to its source. The sender's topic template (e.g.
// "site-a/{topic}" beside filters ["site-a/#"]) puts the records under
// them; a mirror without filters is written but reached by no filter (a
// replay reads one stream, so it cannot be a catch-all). The sender
// publishes each record, MQTT 5 and QoS 1, to $mirror/<mirror stream> with
// its topic, offset, timestamp, client, QoS, expiry and the source's log
// start in user properties (Props, appended after the record's own);
// mochi checks the publisher's ACL on that topic before Hook sees it.
//
// Hook queues each publish to its stream's writer goroutine, which takes
// whatever has queued meanwhile as one batch (one commit) and applies the
// rules (Apply), with N the record's source offset and next the mirror's
// log end:
//
//	N == next                  append (PUBACK success once durable)
//	N <  next                  a resend: PUBACK success, nothing appended
//	N >  next, source start ≥ N  the source's retention dropped next..N-1
//	                           before they were sent: a gap marker at each
//	                           of those offsets, then N
//	N >  next otherwise        refused (PUBACK 0x80): the records between
//	                           were lost on the way, the source still has
//	                           them; the sink reconnects and sends again
//	                           from its position
//
// Appends go through logstore's AppendReplica, which writes at an offset
// only when it is the log end: whatever else happens, no offset holds two
// records and no record sits at an offset other than its source's. A
// duplicate is acked after the batch is durable, so an ack never runs ahead
// of the disk.
//
// Gap markers are records at the missing offsets, topic GapTopic, no
// payload, user property peat-gap "<from>-<to>" (to exclusive), with the
// timestamp of the record after the gap. Records rather than a hole: the
// log's offsets are contiguous (Badger keys, retention and reads all rely
// on it), and a marker says why an offset is empty where a hole could be a
// bug. $ topics match no wildcard filter, so $replay readers see the
// missing offsets as in the source; tools reading the log see the markers.
// A gap of k offsets costs k small records (written 4,096 to a commit),
// no more than the source once held. An empty mirror instead starts its
// log at N (ResetTo), as the source's log start itself moved: no markers
// for what the mirror never held.
//
// peat_mirror_records_total{stream, result} counts appended, duplicate
// and refused records, and gap offsets; each gap is also logged at WARN.
//
// In a site (NewHook with a Site, the cluster's Log) a mirror stream is
// replicated like any other, and a $mirror publish may reach any node: the
// rules run on the mirror stream's leader, against the leader's log end,
// and a node that does not lead it forwards each record with its source
// offset (cluster/log_mirror.go, "Mirror streams in a site"). What the
// leader appends carries its leader epoch, so replicas truncate by it
// after a failover like any stream; a publish is acknowledged once the ISR
// holds it (acks: all; edge refuses acks: leader and unclean elections on
// a mirror, whose lost acknowledged records would leave a hole no resend
// fills). A leader's death drops what it had not committed and refuses
// what was in flight; the sink sends again from its position, and the new
// leader takes what it lacks and acknowledges what it has. Gaps are
// counted on the node the publish reached, from the marker before the
// first record appended.
//
// Limits: one source per mirror stream (two sources under one mirror_as
// would be taken as resends of each other); a source stream recreated
// from offset 0 is all resends to its old mirror.
package mirror
