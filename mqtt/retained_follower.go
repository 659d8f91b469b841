package mqtt

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/peatmq/peat/logstore"
)

// retainedFollower reads one stream's committed log and keeps the retained
// set and its index up to date (see retained.go).
//
// Index changes are coalesced and written with the position at most every
// retainedStoreInterval, so a busy retained topic costs one small write a
// second, not one per record (SD cards wear out). Writing late is safe: a
// restart reads again from the stored position, and applying a record
// twice changes nothing.
type retainedFollower struct {
	rs     *retainedSet
	stream Stream
	pos    uint64 // next offset to read
	first  uint64 // FirstOffset when last looked at

	puts     map[string][]byte   // index entries not yet stored
	dels     map[string]struct{} // index entries to delete, not yet stored
	stored   uint64              // position last stored
	storedAt time.Time
}

// retainedStoreInterval is the longest an index change or a moved position
// waits before it is stored.
const retainedStoreInterval = time.Second

// retainedStoreBatch makes the follower store at once when that many index
// changes are pending.
const retainedStoreBatch = logstore.MaxStateWrite / 2

// run follows s from pos until ctx ends, then stores what is pending.
func (rs *retainedSet) run(ctx context.Context, s Stream, pos uint64) {
	f := &retainedFollower{rs: rs, stream: s, pos: pos, first: s.FirstOffset(),
		puts: map[string][]byte{}, dels: map[string]struct{}{}, stored: pos, storedAt: time.Now()}
	defer f.store(true)
	for {
		changed := s.Changed() // before reading Committed: no advance is missed
		from, first := f.pos, f.first
		if err := f.step(); err != nil {
			rs.logger.Warn("retained: reading the stream failed; retrying",
				attrStream, s.Name(), attrOffset, f.pos, attrErr, err)
			if !deliverySleep(ctx, deliveryRetryDelay) {
				return
			}
			continue
		}
		f.store(false)
		if f.pos != from || f.first != first {
			continue
		}
		if !f.wait(ctx, changed, from, first) {
			return
		}
	}
}

// wait waits for changed, or for the time to store what is pending; it
// reports false when ctx ends.
func (f *retainedFollower) wait(ctx context.Context, changed <-chan struct{}, from, first uint64) bool {
	var tick <-chan time.Time
	if f.pending() {
		t := time.NewTimer(retainedStoreInterval)
		defer t.Stop()
		tick = t.C
	}
	select {
	case <-changed:
		if f.stream.Committed() == from && f.stream.FirstOffset() == first {
			// Nothing new: a closed stream keeps Changed closed, do not spin.
			return deliverySleep(ctx, deliveryRetryDelay)
		}
		return true
	case <-tick:
		return true
	case <-ctx.Done():
		return false
	}
}

func (f *retainedFollower) pending() bool {
	return f.pos != f.stored || len(f.puts) > 0 || len(f.dels) > 0
}

// step follows retention and truncation, then applies one batch.
func (f *retainedFollower) step() error {
	name := f.stream.Name()
	first, end := f.stream.FirstOffset(), f.stream.Committed()
	if first > f.first || end < f.pos {
		// Retention removed records, or the log was truncated below what
		// was applied: their retained messages go.
		keepEnd := uint64(math.MaxUint64)
		if end < f.pos {
			keepEnd = end
		}
		f.rs.mu.Lock()
		dels := f.rs.dropLocked(name, first, keepEnd)
		if end < f.pos {
			f.pos = end
			f.rs.mu.applied[name] = end
			// Snapshots asked for above the new end get what is left: their
			// subscribers' live delivery follows the log back too.
			f.rs.serveBelowLocked(name, math.MaxUint64)
		}
		f.rs.mu.Unlock()
		f.first = first
		for _, k := range dels {
			f.del(k)
		}
	}
	if f.pos < first {
		// Retention removed what was not read yet: nothing below first can
		// be applied any more, and a snapshot must not wait for it.
		f.pos = first
		f.rs.mu.Lock()
		f.rs.advanceLocked(name, first)
		f.rs.mu.Unlock()
	}
	if f.pos >= end {
		return nil
	}
	recs, err := f.stream.Read(f.pos, retainedBatch, 0)
	switch {
	case errors.Is(err, logstore.ErrOffsetOutOfRange) && f.pos < f.stream.FirstOffset():
		return nil // retention got there first: the next step moves on
	case err != nil:
		return err
	case len(recs) == 0:
		return nil
	}
	next := recs[len(recs)-1].Offset + 1
	puts, dels := map[string][]byte{}, []string(nil)
	f.rs.mu.Lock()
	if f.rs.enabled() {
		f.rs.applyLocked(name, recs, next, puts, &dels)
	} else {
		f.rs.advanceLocked(name, next)
	}
	f.rs.mu.Unlock()
	f.pos = next
	for _, k := range dels {
		f.del(k)
	}
	for k, v := range puts {
		delete(f.dels, k)
		f.puts[k] = v
	}
	return nil
}

func (f *retainedFollower) del(key string) {
	delete(f.puts, key)
	f.dels[key] = struct{}{}
}

// store writes the pending index changes with the position, in one step
// (a restart never sees one without the other), when retainedStoreInterval
// has passed or many are pending, or always when final. A failed write
// keeps them pending.
func (f *retainedFollower) store(final bool) {
	if !f.pending() {
		return
	}
	n := len(f.puts) + len(f.dels)
	if !final && n < retainedStoreBatch && time.Since(f.storedAt) < retainedStoreInterval {
		return
	}
	name := f.stream.Name()
	dels := make([]string, 0, len(f.dels))
	for k := range f.dels {
		dels = append(dels, k)
	}
	f.storedAt = time.Now() // a failing store is retried at the same pace
	if err := writeStateChunks(f.rs.st, f.puts, dels, retainedPosKey(name), encodeOffset(f.pos)); err != nil {
		if !errors.Is(err, logstore.ErrClosed) {
			f.rs.logger.Warn("retained: storing the index failed; retrying", attrStream, name, attrErr, err)
		}
		return
	}
	f.puts, f.dels, f.stored = map[string][]byte{}, map[string]struct{}{}, f.pos
}
