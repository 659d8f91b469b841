package logstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// Stream is one append-only offset log. Its appender goroutine is the only
// writer: appends, truncation and retention all go through it, in order.
type Stream struct {
	st   *Store
	name string
	id   uint32
	cfg  StreamConfig

	first     atomic.Uint64 // log start
	next      atomic.Uint64 // log end
	committed atomic.Uint64 // high watermark
	hwMu      sync.Mutex    // orders moves of committed up (SetHighWatermark) against truncation's check
	hwDue     atomic.Bool   // a lazy write of the watermark is scheduled (watermark.go)
	ship      shipSlot      // the group commit being written, shown to followers (ship.go)
	shipEnd   atomic.Uint64 // its end (ShipEnd)
	bytes     atomic.Int64
	epoch     atomic.Uint32 // stamped on appends (SetEpoch); at Open the newest in epochs
	epochs    epochCache    // leader epoch -> first offset (epochs.go)
	tail      tail          // the newest records, served to readers without Badger
	claims    claims        // Claim, Unclaim (stream_state.go)

	incarnation atomic.Uint64 // SetIncarnation (delete.go)

	// mu guards the change channels and the chunk stats. Only the appender
	// changes chunks; other goroutines read them under mu.
	mu struct {
		sync.Mutex
		changed  chan struct{} // Changed: the high watermark moved
		appended chan struct{} // Appended: the log end moved
		closed   bool
		chunks   []chunk // retained chunks, oldest first
	}

	q struct { // the appender's queue
		sync.Mutex
		reqs       []*request
		recs, size int // of the append requests in reqs
		closed     bool
	}
	wake chan struct{}

	// Removal (streams_runtime.go): removed is set before stop is closed,
	// so once the appender is stopped every call sees ErrStreamRemoved;
	// done is closed when the appender has returned.
	removed atomic.Bool
	stop    chan struct{}
	done    chan struct{}

	// appender-only state
	reclaimFrom uint64   // lowest DropPrefix block that may still hold keys
	reclaim     backlog  // dropped, not yet given back (reclaim.go)
	arena       []byte   // encoded records of a group commit
	batchArena  []byte   // their batches
	batchVals   [][]byte // scratch: the values of one batch
	lingerTimer *time.Timer
	lastCommit  time.Time // when the latest group commit began (linger)
	hwPersisted uint64    // the high watermark last written (ManualCommit)
	// shipBroken: a shipped group commit failed in leader epoch
	// shipBrokenEpoch, whose appends are refused (ship.go).
	shipBroken      bool
	shipBrokenEpoch uint32

	mAppended, mBytes, mCorrupt, mDropped prometheus.Counter
	mAppendDur, mCommitDur                prometheus.Observer
}

func newStream(st *Store, sc StreamConfig, id uint32) *Stream {
	m := st.metrics
	s := &Stream{
		st: st, name: sc.Name, id: id, cfg: sc,
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
		mAppended:  m.AppendedRecords.WithLabelValues(sc.Name),
		mBytes:     m.AppendedBytes.WithLabelValues(sc.Name),
		mCorrupt:   m.CorruptRecords.WithLabelValues(sc.Name),
		mDropped:   m.RetentionDropped.WithLabelValues(sc.Name),
		mAppendDur: m.AppendDuration.WithLabelValues(sc.Name),
		mCommitDur: m.CommitDuration.WithLabelValues(sc.Name),
	}
	s.mu.changed = make(chan struct{})
	s.mu.appended = make(chan struct{})
	return s
}

// Name is the stream's name.
func (s *Stream) Name() string { return s.name }

// Config is the stream's configuration.
func (s *Stream) Config() StreamConfig {
	c := s.cfg
	c.Filters = append([]string(nil), c.Filters...)
	return c
}

// Mirror reports whether the stream is a mirror (StreamConfig.Mirror).
func (s *Stream) Mirror() bool { return s.cfg.Mirror }

// Filters returns the topic filters the stream captures.
func (s *Stream) Filters() []string { return append([]string(nil), s.cfg.Filters...) }

// FirstOffset is the log start: the oldest offset retention still holds.
func (s *Stream) FirstOffset() uint64 { return s.first.Load() }

// NextOffset is the log end: the offset the next appended record gets.
func (s *Stream) NextOffset() uint64 { return s.next.Load() }

// Committed is the high watermark: readers see offsets below it. Without
// ManualCommit it follows NextOffset once records are durable.
func (s *Stream) Committed() uint64 { return s.committed.Load() }

// Bytes is what the retained records take (encoded keys and values).
func (s *Stream) Bytes() int64 { return s.bytes.Load() }

// SetEpoch sets the leader epoch stamped on records appended from now on.
// Epochs never go down: once the leader-epoch cache holds a later epoch
// (LatestEpoch), appends fail with ErrStaleEpoch. At Open it is the newest
// epoch in the cache.
func (s *Stream) SetEpoch(e uint32) { s.epoch.Store(e) }

// Changed returns a channel closed the next time Committed (the high
// watermark) advances, the log is truncated or reset, or the stream closes
// (it then stays closed). Take it before reading Committed, so no advance
// is missed. With ManualCommit an append does not close it: readers see
// nothing new until the watermark moves (Appended is the log end's).
func (s *Stream) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.changed
}

// Appended returns a channel closed the next time NextOffset (the log
// end) or ShipEnd advances, the log is truncated or reset, or the stream
// closes: what a leader's replica fetch waits on, since followers take
// records before they are committed. Take it before reading NextOffset.
func (s *Stream) Appended() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.appended
}

// What moved, for notify.
const (
	movedHW  = 1 << iota // the high watermark: Changed
	movedEnd             // the log end: Appended
)

// notify wakes the waiters of what moved.
func (s *Stream) notify(moved int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return
	}
	if moved&movedHW != 0 {
		close(s.mu.changed)
		s.mu.changed = make(chan struct{})
	}
	if moved&movedEnd != 0 {
		close(s.mu.appended)
		s.mu.appended = make(chan struct{})
	}
}

func (s *Stream) closeChanged() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mu.closed {
		s.mu.closed = true
		close(s.mu.changed)
		close(s.mu.appended)
	}
}

func (s *Stream) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.closed
}

// Wait returns nil once Committed() > offset, ErrClosed when the stream
// closes first, or the context's error.
func (s *Stream) Wait(ctx context.Context, offset uint64) error {
	return s.waitPast(ctx, offset, s.Changed, s.Committed)
}

// WaitAppended returns nil once NextOffset() > offset, ErrClosed when the
// stream closes first, or the context's error: a leader's long-polled
// replica fetch, woken by appends that are not committed yet.
func (s *Stream) WaitAppended(ctx context.Context, offset uint64) error {
	return s.waitPast(ctx, offset, s.Appended, s.NextOffset)
}

// waitPast waits until pos() > offset, taking the wake-up channel before
// each check so that no change between the two is missed.
func (s *Stream) waitPast(ctx context.Context, offset uint64, wake func() <-chan struct{}, pos func() uint64) error {
	for {
		ch := wake()
		if pos() > offset {
			return nil
		}
		if s.isClosed() {
			return fmt.Errorf("wait on %s: %w", s.name, s.closedErr())
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Append appends recs and returns the offset of the first once they are
// durable. If ctx ends first, Append returns its error, but the records may
// still be appended.
func (s *Stream) Append(ctx context.Context, recs ...*Record) (first uint64, err error) {
	type result struct {
		first uint64
		err   error
	}
	ch := make(chan result, 1)
	s.AppendAsync(recs, func(first uint64, err error) { ch <- result{first, err} })
	select {
	case r := <-ch:
		return r.first, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// AppendAsync hands recs to the appender; done is called exactly once, on
// the appender goroutine, when they are durable (first is recs[0]'s offset)
// or failed. done must not block. For one stream, done calls happen in the
// order of the AppendAsync calls. After Close, done is called at once with
// ErrClosed. The appender sets each record's Offset, Epoch and (when zero)
// Timestamp; callers must not touch recs until done.
func (s *Stream) AppendAsync(recs []*Record, done func(first uint64, err error)) {
	r := &request{kind: reqAppend, recs: recs, done: done, enqueued: time.Now(), qos0: len(recs) > 0}
	for _, rec := range recs {
		if rec != nil {
			r.size += rec.Size()
			r.qos0 = r.qos0 && rec.QoS == 0
		}
	}
	if !s.enqueue(r) {
		s.st.metrics.AppendErrors.WithLabelValues(s.name, reasonClosed).Inc()
		r.finish(0, fmt.Errorf("append to %s: %w", s.name, s.closedErr()))
	}
}

// Truncate drops every record at or above offset (a follower discarding a
// tail its leader does not have). It goes through the appender, so it is
// ordered with appends. Truncating at or above NextOffset does nothing;
// below FirstOffset is ErrOffsetOutOfRange. With ManualCommit, below
// Committed is ErrBelowHighWatermark: committed records are never taken
// back. Without (a single node, whose watermark is its log end), Committed
// clamps down to offset.
func (s *Stream) Truncate(ctx context.Context, offset uint64) error {
	_, err := s.control(ctx, &request{kind: reqTruncate, offset: offset})
	if err != nil {
		return fmt.Errorf("truncate %s at %d: %w", s.name, offset, err)
	}
	return nil
}

// ApplyRetention drops the oldest records that are older than MaxAge at now
// or that make the stream exceed MaxBytes, and returns how many. The log
// start moves at once; the space comes back with a later, rate-limited
// DropPrefix of whole 65536-offset blocks. The store calls it every
// RetentionInterval. Only committed records are ever dropped.
func (s *Stream) ApplyRetention(ctx context.Context, now time.Time) (dropped uint64, err error) {
	n, err := s.control(ctx, &request{kind: reqRetain, now: now})
	if err != nil {
		return n, fmt.Errorf("retention of %s: %w", s.name, err)
	}
	return n, nil
}

func (s *Stream) control(ctx context.Context, r *request) (uint64, error) {
	r.result = make(chan ctlResult, 1)
	if !s.enqueue(r) {
		return 0, s.closedErr()
	}
	select {
	case res := <-r.result:
		return res.n, res.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// Read returns committed records from offset from: at least one when
// from < Committed() (even if larger than maxBytes), at most max records
// (max <= 0: no limit) and at most maxBytes of Record.Size in total
// (maxBytes <= 0: no limit). It returns an empty slice at Committed(), and
// an error wrapping ErrOffsetOutOfRange below FirstOffset or above
// NextOffset. Between Committed and NextOffset (ManualCommit only) it
// returns an empty slice too: those records are not committed yet, and
// after a crash the watermark may reopen below an offset a reader already
// reached (SetHighWatermark), which it then waits at. A record that fails its checksum or decoding ends the batch:
// the records before it are returned, and a Read starting at it returns a
// *CorruptError.
func (s *Stream) Read(from uint64, max, maxBytes int) ([]*Record, error) {
	s.st.life.RLock()
	defer s.st.life.RUnlock()
	if s.st.life.closed {
		return nil, fmt.Errorf("read %s: %w", s.name, ErrClosed)
	}
	if s.removed.Load() {
		return nil, fmt.Errorf("read %s: %w", s.name, errRemoved)
	}
	hw, start := s.Committed(), s.FirstOffset()
	if from < start || from > hw && from > s.NextOffset() {
		return nil, fmt.Errorf("read %s at %d (log holds [%d, %d)): %w", s.name, from, start, s.NextOffset(), ErrOffsetOutOfRange)
	}
	if from >= hw {
		return []*Record{}, nil
	}
	if recs, ok := s.tail.read(from, hw, max, maxBytes); ok {
		return recs, nil
	}
	want := hw - from
	if max > 0 && uint64(max) < want {
		want = uint64(max)
	}
	out, corrupt, err := s.readStored(from, want, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("read %s at %d: %w", s.name, from, err)
	}
	if corrupt != nil && len(out) == 0 {
		off := from + uint64(len(out))
		// Retention or truncation may have moved while we read.
		if off < s.FirstOffset() || off >= s.Committed() {
			return nil, fmt.Errorf("read %s at %d: %w", s.name, from, ErrOffsetOutOfRange)
		}
		s.mCorrupt.Inc()
		return nil, &CorruptError{Stream: s.name, Offset: off, Err: corrupt}
	}
	return out, nil
}

// readStored reads up to want records from Badger, starting at from, and
// stops at maxBytes or at the first record it cannot return: corrupt says
// why.
func (s *Stream) readStored(from, want uint64, maxBytes int) (out []*Record, corrupt, err error) {
	out = make([]*Record, 0, min(want, 1024))
	var size int
	corrupt, err = s.walkStored(from, func(off uint64, v []byte) (bool, error) {
		rec, err := decodeRecord(off, v)
		if err != nil {
			return false, err
		}
		size += rec.Size()
		if maxBytes > 0 && size > maxBytes && len(out) > 0 {
			return false, nil
		}
		out = append(out, rec)
		return uint64(len(out)) < want, nil
	})
	return out, corrupt, err
}

// walkStored calls take with each stored record value from offset from
// on, in offset order, until take returns false or an error. The seek
// lands on the batch that holds from (the first key at or above it:
// batches are keyed by their last offset and contiguous); the records of
// that batch below from are skipped unread, and the next batches must
// start where the previous one ended. corrupt is take's error, a framing
// fault, a log that ends while take wants more, or a damaged table that
// makes Badger panic (Store.view) at the offset reached. v is valid only
// during the call.
func (s *Stream) walkStored(from uint64, take func(off uint64, v []byte) (more bool, err error)) (corrupt, err error) {
	var vals [][]byte
	more := true
	err = s.st.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagRecord, s.id)})
		defer it.Close()
		off := from
		for it.Seek(recordKey(s.id, from)); it.Valid() && more; it.Next() {
			item := it.Item()
			last := keyOffset(item.Key())
			if err := item.Value(func(v []byte) error {
				first, vs, err := parseBatch(last, v, vals)
				vals = vs
				switch {
				case err != nil:
					return err
				case first > off:
					return fmt.Errorf("record missing (next batch starts at offset %d)", first)
				case first < off && off > from:
					return fmt.Errorf("%w: batch [%d, %d] overlaps the one before", errBatchFraming, first, last)
				}
				for i := off - first; i < uint64(len(vs)) && more; i++ {
					if more, err = take(off, vs[i]); err != nil {
						return err
					}
					off++
				}
				return nil
			}); err != nil {
				corrupt = err
				return nil
			}
		}
		if more && corrupt == nil {
			corrupt = fmt.Errorf("record missing (log ends early)")
		}
		return nil
	})
	var damaged damagedError
	if errors.As(err, &damaged) {
		return damaged, nil
	}
	return corrupt, err
}

// OffsetForTime returns the first offset whose record has a timestamp at
// or after t, or Committed() when every record is older. It uses the chunk
// stats, then scans one chunk (at most 1024 records).
func (s *Stream) OffsetForTime(t time.Time) (uint64, error) {
	ms := t.UnixMilli()
	hw := s.Committed()
	var from uint64
	found := false
	s.mu.Lock()
	for _, c := range s.mu.chunks {
		if c.count > 0 && c.maxTs >= ms {
			from, found = c.start, true
			break
		}
	}
	s.mu.Unlock()
	if !found {
		return hw, nil
	}
	from = max(from, s.FirstOffset())
	for from < hw {
		recs, err := s.Read(from, chunkSize, 0)
		if err != nil {
			return 0, fmt.Errorf("find offset for %s in %s: %w", t.Format(time.RFC3339Nano), s.name, err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			if r.Timestamp >= ms {
				return r.Offset, nil
			}
		}
		from = recs[len(recs)-1].Offset + 1
	}
	return hw, nil
}
