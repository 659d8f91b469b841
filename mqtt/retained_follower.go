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
type retainedFollower struct {
	rs     *retainedSet
	stream Stream
	pos    uint64 // next offset to read
	first  uint64 // FirstOffset when last looked at

	stored   uint64 // position last stored
	storedAt time.Time
}

// runRetained rebuilds the retained messages of s and follows s until ctx
// ends, storing its position on the way out. A failed rebuild is logged and
// followed from the log's start, which rebuilds the index too.
func (rs *retainedSet) run(ctx context.Context, s Stream, pos uint64) {
	f := &retainedFollower{rs: rs, stream: s, pos: pos, stored: pos, storedAt: time.Now(), first: s.FirstOffset()}
	defer f.storePos(true)
	for {
		changed := s.Changed() // before reading Committed: no advance is missed
		from := f.pos
		if err := f.step(); err != nil {
			rs.logger.Warn("retained: reading the stream failed; retrying",
				attrStream, s.Name(), attrOffset, f.pos, attrErr, err)
			if !deliverySleep(ctx, deliveryRetryDelay) {
				return
			}
			continue
		}
		f.storePos(false)
		if f.pos != from {
			continue
		}
		select {
		case <-changed:
			if f.pos == s.Committed() && f.first == s.FirstOffset() && s.Committed() == from {
				// A closed stream keeps Changed closed: do not spin.
				if !deliverySleep(ctx, deliveryRetryDelay) {
					return
				}
			}
		case <-ctx.Done():
			return
		}
	}
}

// step follows retention and truncation, then applies one batch.
func (f *retainedFollower) step() error {
	name := f.stream.Name()
	first, end := f.stream.FirstOffset(), f.stream.Committed()
	if first > f.first || end < f.pos {
		// Retention removed records, or the log was truncated below what
		// was applied: their retained messages go.
		// Without truncation nothing above is dropped: ingest may have set a
		// record committed since end was read.
		keepEnd := uint64(math.MaxUint64)
		if end < f.pos {
			keepEnd = end
		}
		f.rs.mu.Lock()
		dels := f.rs.dropLocked(name, first, keepEnd)
		if end < f.pos {
			f.pos = end
			f.rs.mu.applied[name] = end
		}
		f.rs.mu.Unlock()
		f.first = first
		if err := writeStateChunks(f.rs.st, map[string][]byte{retainedPosKey(name): encodeOffset(f.pos)}, dels); err != nil {
			return err
		}
		f.stored, f.storedAt = f.pos, time.Now()
	}
	if f.pos < first {
		f.pos = first
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
	from, next := f.pos, recs[len(recs)-1].Offset+1
	puts, dels := map[string][]byte{}, []string(nil)
	f.rs.mu.Lock()
	if f.rs.enabled() {
		f.rs.applyLocked(name, recs, next, puts, &dels)
	} else {
		f.rs.mu.applied[name] = next
	}
	f.rs.mu.Unlock()
	f.pos = next
	if len(puts) == 0 && len(dels) == 0 {
		return nil
	}
	// The index and the position move in one write: a restart never sees
	// one without the other.
	puts[retainedPosKey(name)] = encodeOffset(f.pos)
	if err := writeStateChunks(f.rs.st, puts, dels); err != nil {
		f.pos = from // read the batch again: applying it twice changes nothing
		return err
	}
	f.stored, f.storedAt = f.pos, time.Now()
	return nil
}

// storePos stores the position when it moved and retainedPosInterval has
// passed (or always, when final), so a restart re-reads little.
func (f *retainedFollower) storePos(final bool) {
	if f.pos == f.stored || (!final && time.Since(f.storedAt) < retainedPosInterval) {
		return
	}
	name := f.stream.Name()
	if err := f.rs.st.WriteState(map[string][]byte{retainedPosKey(name): encodeOffset(f.pos)}, nil); err != nil {
		if !errors.Is(err, logstore.ErrClosed) {
			f.rs.logger.Warn("retained: storing the position failed", attrStream, name, attrErr, err)
		}
		return
	}
	f.stored, f.storedAt = f.pos, time.Now()
}
