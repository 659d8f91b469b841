package mqtt

import "sync/atomic"

// Resends to a durable session.
//
// A PUBLISH the server sends again must carry DUP 1, and one it sends for
// the first time DUP 0 [MQTT-3.3.1-1] [MQTT-3.3.1-3]. A resumed session is
// served from the log, from its first unacknowledged offset, so what it
// gets first may be records an earlier connection was sent and did not
// acknowledge. Each durable client's place in a stream keeps a resends:
// the offset below which its records were written to an earlier
// connection of the session, and the highest one written on this one.
// The session keeps the latter when the connection ends (sessions.wrote),
// and a connection that takes over a live one also follows that one's
// mark, since the old connection leaves the reader after the new one
// joined and may still be finishing a write. The mark lives in memory: after a broker restart resends carry
// DUP 0.

// resends marks one durable client's deliveries from one stream.
type resends struct {
	below uint64 // records below it were written to an earlier connection
	// written is the offset after the highest QoS 1/2 record written on
	// this connection; prev is that of the connection this one took over
	// while it was still writing (nil if none).
	written, prev *atomic.Uint64
}

// newResends starts the marks of a connection: below is where the
// session's earlier connections got to, prev the place of a connection
// this one takes over (nil if none).
func newResends(below uint64, prev *resends) *resends {
	rs := &resends{below: below, written: new(atomic.Uint64)}
	if prev != nil {
		rs.below = max(below, prev.end())
		rs.prev = prev.written
	}
	return rs
}

// dup reports whether the record at offset is a resend.
func (rs *resends) dup(offset uint64) bool {
	return rs != nil && (offset < rs.below || rs.prev != nil && offset < rs.prev.Load())
}

// wrote notes that the QoS 1/2 record at offset was written.
func (rs *resends) wrote(offset uint64) {
	if rs == nil {
		return
	}
	for {
		old := rs.written.Load()
		if old > offset || rs.written.CompareAndSwap(old, offset+1) {
			return
		}
	}
}

// end is the offset after the highest record written to any connection.
func (rs *resends) end() uint64 {
	n := max(rs.below, rs.written.Load())
	if rs.prev != nil {
		n = max(n, rs.prev.Load())
	}
	return n
}
