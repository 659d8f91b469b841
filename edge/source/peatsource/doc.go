// Package peatsource is a source.Upstream that pulls one stream of
// another Peat (headquarters) into a local mirror stream, at the same
// offsets, over MQTT 5: the site dials out, so headquarters needs no
// route to it.
//
// Each connection subscribes to $replay/<end>/+/<filter>, end the mirror
// stream's log end (source.Resume.End), with QoS 2 (every record comes
// with the QoS it was published with) and a clean session: the log is
// the only position, so nothing is kept upstream. The SUBACK must accept
// the replay (and, with Stream set, name that stream: a filter that
// reaches another stream is refused rather than mirrored); its start
// above end means headquarters' retention dropped what lies between.
// The SUBSCRIBE asks for each record's publisher (user property client
// "true"): headquarters shows a publisher's client id only to a
// subscriber that asks and whose user its ACL lets see that id (a
// clientid read rule; every id without an ACL), and says in the SUBACK
// that it knows the request (a Peat that does not is logged at WARN).
// Each delivery, $replay/<from>/<offset>/<topic> with the user
// properties stream, offset and timestamp after the record's own, and
// client after them when shown, is turned back into the record: its
// offset, timestamp (headquarters'), publisher's client id (none when
// not shown), topic (through the Topic template, "{topic}" by default),
// payload, QoS, retain flag and MQTT 5 properties; the replay's
// properties are taken off. An expired record's interval comes back
// exact, a live one's to the second.
//
// The records are written by the mirror rules (edge/mirror.Apply, or a
// site's Log.Mirror on the mirror stream's leader): MirrorLog gives the
// source framework a stream whose appends put each record at its own
// offset. Headquarters delivers a replay in offset order and leaves out
// only what it cannot give (records its retention dropped, its own gap
// markers, records the filter or its ACL do not reach), so each record
// is taken as headquarters' log start as far as the mirror is concerned:
// offsets before it that the mirror lacks become gap markers (on an
// empty mirror, the log starts there). That is safe only if no record is
// written after one that failed: batches go one at a time (Next waits
// for the Done of the one before), and the framework ends the
// connection on a failed write.
//
// A record is acknowledged upstream (PUBACK, or PUBREC then PUBCOMP)
// once it is stored here; as the next connection starts from the
// mirror's log end anyway, acknowledgements only pace headquarters
// (Window is the Receive Maximum it is given). A restart, a dropped
// connection or a failover resumes at the end of what is stored: no
// record twice (a resend would be a duplicate to the mirror rules
// anyway), none missing. Lag is what is left of the history headquarters
// held when the replay started.
package peatsource
