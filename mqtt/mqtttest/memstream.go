package mqtttest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
)

// waitTimeout only keeps a broken test from hanging in WaitAppends or
// WaitRecords; no test should come near it.
const waitTimeout = 10 * time.Second

type memAppend struct {
	recs []*logstore.Record
	done func(first uint64, err error)
}

// MemStream is one in-memory stream with a single appender goroutine.
//
// Tests steer it: Hold queues appends until Release, Fail makes appends
// fail, Trim drops old records as retention would. WaitAppends waits until
// a number of AppendAsync calls have been made (held or not), so tests
// synchronise on counts, never on sleeps.
type MemStream struct {
	name    string
	filters []string

	mu struct {
		sync.Mutex
		recs      []*logstore.Record // recs[i] has offset first+i
		first     uint64
		changed   chan struct{}
		queue     []memAppend
		held      bool
		failErr   error
		submitted int           // AppendAsync calls so far
		submitCh  chan struct{} // closed and replaced on every AppendAsync
		closed    bool
	}
	state *memStreamState // memstream_state.go
	wake  chan struct{}   // 1-buffered: the queue or hold state changed
	stop  chan struct{}
	done  chan struct{}
}

func newMemStream(name string, filters []string) *MemStream {
	s := &MemStream{
		name:    name,
		filters: filters,
		state:   newMemStreamState(),
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	s.mu.changed = make(chan struct{})
	s.mu.submitCh = make(chan struct{})
	go s.appender()
	return s
}

// Name is the stream's name.
func (s *MemStream) Name() string { return s.name }

// Filters are the topic filters the stream captures.
func (s *MemStream) Filters() []string { return slices.Clone(s.filters) }

// OffsetForTime returns the first offset whose record has a timestamp at or
// after t, or Committed() when every record is older.
func (s *MemStream) OffsetForTime(t time.Time) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ms := t.UnixMilli()
	for i, r := range s.mu.recs {
		if r.Timestamp >= ms {
			return s.mu.first + uint64(i), nil
		}
	}
	return s.mu.first + uint64(len(s.mu.recs)), nil
}

// AppendAsync queues recs for the appender, which sets their Offset and
// (when zero) Timestamp and then calls done, in call order.
func (s *MemStream) AppendAsync(recs []*logstore.Record, done func(first uint64, err error)) {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		done(0, fmt.Errorf("append to %s: %w", s.name, logstore.ErrClosed))
		return
	}
	s.mu.queue = append(s.mu.queue, memAppend{recs: recs, done: done})
	s.mu.submitted++
	close(s.mu.submitCh)
	s.mu.submitCh = make(chan struct{})
	s.mu.Unlock()
	s.poke()
}

func (s *MemStream) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *MemStream) appender() {
	defer close(s.done)
	for {
		s.mu.Lock()
		var a memAppend
		var ok bool
		if !s.mu.held && len(s.mu.queue) > 0 {
			a, ok = s.mu.queue[0], true
			s.mu.queue = s.mu.queue[1:]
		}
		s.mu.Unlock()
		if !ok {
			select {
			case <-s.wake:
				continue
			case <-s.stop:
				s.failQueue()
				return
			}
		}
		s.commit(a)
	}
}

// commit applies one append (or its refusal) and calls done. A refused
// append takes no offset, as in logstore.
func (s *MemStream) commit(a memAppend) {
	s.mu.Lock()
	err := s.mu.failErr
	if err == nil && slices.Contains(a.recs, nil) {
		err = logstore.ErrNilRecord
	}
	if err != nil {
		s.mu.Unlock()
		a.done(0, fmt.Errorf("append to %s: %w", s.name, err))
		return
	}
	first := s.mu.first + uint64(len(s.mu.recs))
	now := time.Now().UnixMilli()
	for i, r := range a.recs {
		r.Offset = first + uint64(i)
		if r.Timestamp == 0 {
			r.Timestamp = now
		}
	}
	s.mu.recs = append(s.mu.recs, a.recs...)
	if len(a.recs) > 0 && !s.mu.closed {
		close(s.mu.changed)
		s.mu.changed = make(chan struct{})
	}
	s.mu.Unlock()
	a.done(first, nil)
}

func (s *MemStream) failQueue() {
	s.mu.Lock()
	q := s.mu.queue
	s.mu.queue = nil
	s.mu.Unlock()
	for _, a := range q {
		a.done(0, fmt.Errorf("append to %s: %w", s.name, logstore.ErrClosed))
	}
}

// Read returns committed records from offset from, within the limits of
// mqtt.Stream.Read (max or maxBytes <= 0: no limit).
func (s *MemStream) Read(from uint64, max, maxBytes int) ([]*logstore.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil, fmt.Errorf("read %s: %w", s.name, logstore.ErrClosed)
	}
	end := s.mu.first + uint64(len(s.mu.recs))
	if from < s.mu.first || from > end {
		return nil, fmt.Errorf("read %s at %d (log holds [%d, %d)): %w", s.name, from, s.mu.first, end, logstore.ErrOffsetOutOfRange)
	}
	out := []*logstore.Record{}
	size := 0
	for i := from - s.mu.first; i < uint64(len(s.mu.recs)) && (max <= 0 || len(out) < max); i++ {
		r := s.mu.recs[i]
		size += r.Size()
		if maxBytes > 0 && size > maxBytes && len(out) > 0 {
			break
		}
		out = append(out, r)
	}
	return out, nil
}

// FirstOffset is the offset of the oldest record Trim left.
func (s *MemStream) FirstOffset() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.first
}

// Committed is the offset after the last committed record.
func (s *MemStream) Committed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.first + uint64(len(s.mu.recs))
}

// Changed returns a channel closed at the next commit, Trim or Close.
func (s *MemStream) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.changed
}

// Wake closes Changed without committing anything: the wake with nothing
// new that a cluster's stream gives a reader whose read already took the
// records of the advance it was closed for.
func (s *MemStream) Wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mu.closed {
		close(s.mu.changed)
		s.mu.changed = make(chan struct{})
	}
}

// Hold queues appends without committing them until Release.
func (s *MemStream) Hold() {
	s.mu.Lock()
	s.mu.held = true
	s.mu.Unlock()
}

// Release lets held appends commit, in order.
func (s *MemStream) Release() {
	s.mu.Lock()
	s.mu.held = false
	s.mu.Unlock()
	s.poke()
}

// Fail makes every following append fail with err (wrapped); nil heals.
func (s *MemStream) Fail(err error) {
	s.mu.Lock()
	s.mu.failErr = err
	s.mu.Unlock()
}

// Trim drops the records below off, as retention would.
func (s *MemStream) Trim(off uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	end := s.mu.first + uint64(len(s.mu.recs))
	if s.mu.closed || off <= s.mu.first {
		return
	}
	off = min(off, end)
	s.mu.recs = slices.Clone(s.mu.recs[off-s.mu.first:])
	s.mu.first = off
	close(s.mu.changed)
	s.mu.changed = make(chan struct{})
}

// Truncate drops the committed records at and above off, moving Committed
// back: what an unclean leader election in a cluster can do to a log that
// readers already read. Offsets from off on are given again.
func (s *MemStream) Truncate(off uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	end := s.mu.first + uint64(len(s.mu.recs))
	if s.mu.closed || off >= end {
		return
	}
	off = max(off, s.mu.first)
	s.mu.recs = slices.Clone(s.mu.recs[:off-s.mu.first])
	close(s.mu.changed)
	s.mu.changed = make(chan struct{})
}

// Records returns a copy of the committed records.
func (s *MemStream) Records() []*logstore.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.mu.recs)
}

// Submitted is the number of AppendAsync calls so far.
func (s *MemStream) Submitted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.submitted
}

// WaitAppends waits until at least n AppendAsync calls were made (held or
// not).
func (s *MemStream) WaitAppends(tb testing.TB, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for {
		s.mu.Lock()
		got, ch := s.mu.submitted, s.mu.submitCh
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			tb.Fatalf("memlog %s: %d appends submitted, want %d", s.name, got, n)
		}
	}
}

// WaitRecords waits until at least n records are committed and returns
// them.
func (s *MemStream) WaitRecords(tb testing.TB, n int) []*logstore.Record {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for {
		ch := s.Changed()
		if recs := s.Records(); len(recs) >= n {
			return recs
		}
		if s.closed() {
			tb.Fatalf("memlog %s: closed with %d records committed, want %d", s.name, len(s.Records()), n)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			tb.Fatalf("memlog %s: %d records committed, want %d", s.name, len(s.Records()), n)
		}
	}
}

func (s *MemStream) closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.closed
}

// Close stops the appender: appends queued or held fail with
// logstore.ErrClosed, later ones at once, and Changed stays closed. It is
// idempotent.
func (s *MemStream) Close() {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return
	}
	s.mu.closed = true
	close(s.mu.changed) // stays closed: Changed of a closed stream never blocks
	s.mu.Unlock()
	s.closeState()
	close(s.stop)
	<-s.done
}
