package logstore

import (
	"fmt"
	"sync"
)

// Early shipping (ManualCommit only): a leader's group commit is shown to
// its followers' fetches (ReadRaw) while its own transaction and fsync
// are still running, so that each follower's append and fsync overlap the
// leader's instead of following it. An acks=all acknowledgement then
// waits for about one fsync instead of two in a row. Nothing is
// acknowledged or read early: the high watermark still counts the
// leader's own durable log end (NextOffset), and Read stops at it.
//
// A follower may so hold records the leader has not written. If the
// leader crashes first, that is Kafka's case of a follower ahead of a
// leader that comes back: KIP-101's truncation by leader epoch settles it
// either way. If the leader's write fails while it lives, the offsets it
// showed must never name other records in the same leader epoch (a
// follower fetches from its own log end and would keep the old ones
// undetected): the stream refuses appends (ErrShippedUnwritten) until a
// new leader epoch is set, whose followers truncate the old epoch's
// unwritten records away.

// ErrShippedUnwritten refuses appends after records shown to followers
// could not be written, until the stream's leader epoch changes.
var ErrShippedUnwritten = fmt.Errorf("logstore: records shown to followers could not be written; appends wait for a new leader epoch")

// testHookShipped, when set (tests only), runs once a group commit is
// shown to followers, before it is written; an error it returns fails the
// commit as a failed write would.
var testHookShipped func() error

// shipSlot is the group commit being written: vals[i] is the encoded
// value at base+i, sub-slices of the appender's arena, valid until the
// slot is cleared (the next group commit reuses the arena).
type shipSlot struct {
	sync.RWMutex
	base uint64
	vals [][]byte
}

// ShipEnd is the log end as a leader's followers may fetch it: NextOffset
// plus the group commit being written (early shipping), NextOffset when
// none is. Take Appended before reading it.
func (s *Stream) ShipEnd() uint64 { return max(s.shipEnd.Load(), s.next.Load()) }

// shipBegin shows ents, at offsets from base on, to followers' fetches
// (appender goroutine, before writing them).
func (s *Stream) shipBegin(base uint64, ents []pending) {
	vals := make([][]byte, len(ents))
	for i := range ents {
		vals[i] = ents[i].val
	}
	s.ship.Lock()
	s.ship.base, s.ship.vals = base, vals
	s.ship.Unlock()
	s.shipEnd.Store(base + uint64(len(ents)))
	s.notify(movedEnd)
}

// shipEndWrite takes the slot down once the group commit is written or
// has failed (appender goroutine): from here on fetches read what Badger
// holds. A failure leaves the stream refusing appends in this epoch.
func (s *Stream) shipEndWrite(failed bool) {
	s.ship.Lock()
	s.ship.vals = nil
	s.ship.Unlock()
	s.shipEnd.Store(s.next.Load())
	if failed {
		s.shipBroken, s.shipBrokenEpoch = true, s.epoch.Load()
		s.st.log.Error("logstore: a group commit shown to followers was not written: appends refused until a new leader epoch",
			attrStream, s.name)
	}
}

// shipRefused says whether appends in the current epoch are refused after
// a failed shipped commit (appender goroutine).
func (s *Stream) shipRefused() bool {
	if s.shipBroken && s.epoch.Load() != s.shipBrokenEpoch {
		s.shipBroken = false
	}
	return s.shipBroken
}

// shipResetTo drops what is shown beyond offset, the new log end
// (truncation and reset, appender goroutine: no group commit is being
// written then).
func (s *Stream) shipResetTo(offset uint64) { s.shipEnd.Store(offset) }

// readShipped appends to out copies of the values being written from
// offset from on (from must be the end of what out holds from Badger),
// within want values and maxBytes in total.
func (s *Stream) readShipped(out [][]byte, from, want uint64, maxBytes int) [][]byte {
	s.ship.RLock()
	defer s.ship.RUnlock()
	if s.ship.vals == nil || from < s.ship.base || from >= s.ship.base+uint64(len(s.ship.vals)) {
		return out
	}
	size := 0
	for _, v := range out {
		size += len(v)
	}
	vals := s.ship.vals[from-s.ship.base:]
	n, total := 0, 0
	for _, v := range vals {
		if uint64(len(out)+n) >= want || maxBytes > 0 && size+total+len(v) > maxBytes && len(out)+n > 0 {
			break
		}
		n++
		total += len(v)
	}
	buf := make([]byte, 0, total) // one copy for all: the arena is reused by the next commit
	for _, v := range vals[:n] {
		b0 := len(buf)
		buf = append(buf, v...)
		out = append(out, buf[b0:len(buf):len(buf)])
	}
	return out
}
