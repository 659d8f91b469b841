package mqtt

import (
	"encoding/binary"
	"strings"
	"sync/atomic"
)

// Resends to a durable session.
//
// A PUBLISH the server sends again must carry DUP 1, and one it sends for
// the first time DUP 0 [MQTT-3.3.1-1] [MQTT-3.3.1-3]. A resumed session is
// served from the log, from its first unacknowledged offset, so what it
// gets first may be records an earlier connection was sent and did not
// acknowledge. Each durable client's place in a stream, and each of its
// $replay subscriptions, keeps a resends: the offset below which its
// records were written to an earlier connection of the session, and the
// highest one written on this one. The session keeps the latter when the
// connection ends (sessions.wrote), and a connection that takes over a
// live one also follows that one's mark, since the old connection leaves
// the reader after the new one joined and may still be finishing a write;
// so does one whose session resumes before the taps of the last
// connection have ended (sessions.track).
//
// The marks outlive the broker: each is kept beside its offset in the
// stream's state ("w" before the offset's key), written with the offset
// and, while nothing is acknowledged, within the state writer's interval
// of the first record written after the last write. So after a restart,
// or in a site on another broker, a resend still carries DUP 1, except
// for records first written in the last interval before a kill -9: those
// go again with DUP 0 (a receiver must treat DUP as a hint anyway,
// [MQTT-3.3.1-3]). A separate key rather than a longer offset value: a
// Peat that does not know marks reads the offset as before.

// resends marks one durable client's deliveries from one stream.
type resends struct {
	below uint64 // records below it were written to an earlier connection
	// written is the offset after the highest QoS 1/2 record written on
	// this connection; prev is that of the connection this one took over
	// while it was still writing (nil if none).
	written, prev *atomic.Uint64
	// save, when not nil, asks for the mark to be stored; saving is set
	// from that request until the store took the mark.
	save   func()
	saving atomic.Bool
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
			break
		}
	}
	if rs.save != nil && !rs.saving.Load() && rs.saving.CompareAndSwap(false, true) {
		rs.save()
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

// Resend marks in a stream's state: "w" before the key of the offset
// they go with (cursorKey.ref).
const markStatePrefix = "w"

// markRef is where the resend mark of id's offset c is stored.
func (c cursorKey) markRef(id string) stateRef {
	r := c.ref(id)
	r.key = markStatePrefix + r.key
	return r
}

// markOf parses a resend mark's key of stream's state; ok is false for
// other keys.
func markOf(stream, key string) (id string, c cursorKey, ok bool) {
	rest, ok := strings.CutPrefix(key, markStatePrefix)
	if !ok {
		return "", cursorKey{}, false
	}
	return cursorOf(stream, rest)
}

// liveEnds is the marks of connections still writing.
func liveEnds(live map[cursorKey]*resends) map[cursorKey]uint64 {
	ends := make(map[cursorKey]uint64, len(live))
	for c, rs := range live {
		ends[c] = rs.end()
	}
	return ends
}

// track starts the marks of a connection of id in c (newResends) and
// makes them c's live mark: stored as they move, and taken into the
// session when untrack is called, unless c was unsubscribed or another
// connection tracks it meanwhile. prev is the marks of a connection this
// one takes over, when the caller knows it; without it, marks still live
// in c are followed: they are an earlier connection's whose delivery has
// not ended yet (a tap's goroutine exits after its connection has gone),
// and whose untrack will no longer hand them to the session.
func (ss *sessions) track(id string, c cursorKey, prev *resends) (rs *resends, untrack func()) {
	ss.mu.Lock()
	s := ss.m[id]
	var below uint64
	if s != nil {
		below = s.written[c]
		if prev == nil {
			prev = s.live[c]
		}
	}
	rs = newResends(below, prev)
	if s != nil && !s.transient {
		if s.live == nil {
			s.live = map[cursorKey]*resends{}
		}
		s.live[c] = rs
		rs.save = func() { ss.saveMark(id, c, false) }
	}
	ss.mu.Unlock()
	return rs, func() {
		ss.mu.Lock()
		s := ss.m[id]
		tracked := s != nil && s.live[c] == rs // not since unsubscribed or taken over
		if tracked {
			delete(s.live, c)
		}
		ss.mu.Unlock()
		if tracked {
			ss.wrote(id, c, rs.end())
		}
	}
}

// wrote notes that the session of id was written the records below off
// in c.
func (ss *sessions) wrote(id string, c cursorKey, off uint64) {
	ss.mu.Lock()
	s := ss.m[id]
	if s == nil || off <= s.written[c] {
		ss.mu.Unlock()
		return
	}
	if s.written == nil {
		s.written = map[cursorKey]uint64{}
	}
	s.written[c] = off
	ss.mu.Unlock()
	ss.saveMark(id, c, false)
}

// saveMark writes the resend mark of id's offset c, as saveCursors does
// the offset: deleted when the session ended or is transient, or has no
// mark for c.
func (ss *sessions) saveMark(id string, c cursorKey, urgent bool) {
	ss.w.putFunc(c.markRef(id), func() ([]byte, bool) {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if !ss.mayWrite(id) {
			return nil, false
		}
		s := ss.m[id]
		if s == nil || s.transient {
			return nil, true
		}
		mark := s.written[c]
		if rs := s.live[c]; rs != nil {
			rs.saving.Store(false) // a write after this one takes what follows
			mark = max(mark, rs.end())
		}
		if mark == 0 {
			return nil, true
		}
		return encodeOffset(mark), true
	}, urgentDone(urgent))
}

// loadMarks reads the resend marks stored in stream s into the sessions
// they belong to, and deletes those of clients without a session (as
// loadCursors does offsets).
func (ss *sessions) loadMarks(s Stream) ([]stateRef, error) {
	var stale []stateRef
	err := s.LoadState(markStatePrefix, func(k string, v []byte) error {
		id, c, ok := markOf(s.Name(), k)
		if !ok || len(v) != 8 {
			return nil // not a mark this Peat knows: leave it
		}
		ss.mu.Lock()
		defer ss.mu.Unlock()
		sess := ss.m[id]
		if sess == nil {
			if !ss.shared {
				stale = append(stale, c.markRef(id))
			}
			return nil
		}
		if sess.written == nil {
			sess.written = map[cursorKey]uint64{}
		}
		sess.written[c] = max(sess.written[c], binary.BigEndian.Uint64(v))
		return nil
	})
	return stale, err
}
