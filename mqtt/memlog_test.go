package mqtt

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
)

// memLog is an in-memory Log for tests, faithful to the contract in log.go:
// one appender goroutine per stream calls done in AppendAsync order, records
// become visible to Read only once committed, Changed is closed on every
// commit, trim and close.
//
// Tests steer the appender: hold() queues appends until release(), fail(err)
// makes appends fail. waitAppends waits
// until a number of AppendAsync calls have been made (held or not), so tests
// synchronise on channels and counts, never on sleeps.
type memLog struct {
	streams []*memStream
	router  *logstore.Router // routes as the store does
	state   *memState
}

var _ Log = (*memLog)(nil)

// The memLog wraps logstore's sentinels, as the real log does.
var (
	errMemClosed     = logstore.ErrClosed           // appends after close, and appends queued at close
	errMemOutOfRange = logstore.ErrOffsetOutOfRange // Read outside [FirstOffset, Committed]
)

// newMemLog builds a memLog from "name=filter,filter" specs, e.g.
// newMemLog(t, "default=#") or newMemLog(t, "a=sensors/#", "b=meters/+/power").
// Its appenders stop at test cleanup.
func newMemLog(tb testing.TB, specs ...string) *memLog {
	tb.Helper()
	l := &memLog{state: &memState{m: map[string][]byte{}}}
	var filters [][]string
	for _, spec := range specs {
		name, fs, ok := strings.Cut(spec, "=")
		if !ok || name == "" || fs == "" {
			tb.Fatalf("memlog: bad stream spec %q, want name=filter[,filter]", spec)
		}
		s := newMemStream(name)
		s.filters = strings.Split(fs, ",")
		l.streams = append(l.streams, s)
		filters = append(filters, s.filters)
	}
	var err error
	if l.router, err = logstore.NewRouter(filters); err != nil {
		tb.Fatalf("memlog: %v", err)
	}
	tb.Cleanup(l.close)
	return l
}

// Route returns the stream whose filter is the most specific match.
func (l *memLog) Route(topic string) Stream {
	if i := l.router.Route(topic); i >= 0 {
		return l.streams[i]
	}
	return nil
}

func (l *memLog) Streams() []Stream {
	out := make([]Stream, len(l.streams))
	for i, s := range l.streams {
		out[i] = s
	}
	return out
}

func (l *memLog) State() StateStore { return l.state }

// memState is an in-memory StateStore.
type memState struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memState) WriteState(puts map[string][]byte, dels []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range puts {
		s.m[k] = append([]byte(nil), v...)
	}
	for _, k := range dels {
		delete(s.m, k)
	}
	return nil
}

func (s *memState) LoadState(prefix string, fn func(string, []byte) error) error {
	s.mu.Lock()
	keys := make([]string, 0, len(s.m))
	for k := range s.m {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	s.mu.Unlock()
	slices.Sort(keys)
	for _, k := range keys {
		s.mu.Lock()
		v, ok := s.m[k]
		s.mu.Unlock()
		if ok {
			if err := fn(k, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// stream returns the named stream, for test assertions and steering.
func (l *memLog) stream(tb testing.TB, name string) *memStream {
	tb.Helper()
	for _, s := range l.streams {
		if s.name == name {
			return s
		}
	}
	tb.Fatalf("memlog: no stream %q", name)
	return nil
}

func (l *memLog) close() {
	for _, s := range l.streams {
		s.close()
	}
}

type memAppend struct {
	recs []*logstore.Record
	done func(first uint64, err error)
}

// memStream is one in-memory stream with a single appender goroutine.
type memStream struct {
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
	wake chan struct{} // 1-buffered: the queue or hold state changed
	stop chan struct{}
	done chan struct{}
}

var _ Stream = (*memStream)(nil)

func newMemStream(name string) *memStream {
	s := &memStream{
		name: name,
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	s.mu.changed = make(chan struct{})
	s.mu.submitCh = make(chan struct{})
	go s.appender()
	return s
}

func (s *memStream) Name() string { return s.name }

func (s *memStream) Filters() []string { return s.filters }

func (s *memStream) OffsetForTime(t time.Time) (uint64, error) {
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

func (s *memStream) AppendAsync(recs []*logstore.Record, done func(first uint64, err error)) {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		done(0, fmt.Errorf("append to %s: %w", s.name, errMemClosed))
		return
	}
	s.mu.queue = append(s.mu.queue, memAppend{recs: recs, done: done})
	s.mu.submitted++
	close(s.mu.submitCh)
	s.mu.submitCh = make(chan struct{})
	s.mu.Unlock()
	s.poke()
}

func (s *memStream) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *memStream) appender() {
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

// commit applies one append (or its configured failure) and calls done.
func (s *memStream) commit(a memAppend) {
	s.mu.Lock()
	if err := s.mu.failErr; err != nil {
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

func (s *memStream) failQueue() {
	s.mu.Lock()
	q := s.mu.queue
	s.mu.queue = nil
	s.mu.Unlock()
	for _, a := range q {
		a.done(0, fmt.Errorf("append to %s: %w", s.name, errMemClosed))
	}
}

func (s *memStream) Read(from uint64, max, maxBytes int) ([]*logstore.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	end := s.mu.first + uint64(len(s.mu.recs))
	if from < s.mu.first || from > end {
		return nil, fmt.Errorf("read %s from %d (log holds [%d, %d)): %w", s.name, from, s.mu.first, end, errMemOutOfRange)
	}
	var out []*logstore.Record
	size := 0
	for i := from - s.mu.first; i < uint64(len(s.mu.recs)) && len(out) < max; i++ {
		r := s.mu.recs[i]
		if len(out) > 0 && size+r.Size() > maxBytes {
			break
		}
		size += r.Size()
		out = append(out, r)
	}
	if out == nil {
		out = []*logstore.Record{}
	}
	return out, nil
}

func (s *memStream) FirstOffset() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.first
}

func (s *memStream) Committed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.first + uint64(len(s.mu.recs))
}

func (s *memStream) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.changed
}

// hold queues appends without committing them until release.
func (s *memStream) hold() {
	s.mu.Lock()
	s.mu.held = true
	s.mu.Unlock()
}

// release lets held appends commit, in order.
func (s *memStream) release() {
	s.mu.Lock()
	s.mu.held = false
	s.mu.Unlock()
	s.poke()
}

// fail makes every following append fail with err (wrapped); nil heals.
func (s *memStream) fail(err error) {
	s.mu.Lock()
	s.mu.failErr = err
	s.mu.Unlock()
}

// trim drops records below off, as retention would.
func (s *memStream) trim(off uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	end := s.mu.first + uint64(len(s.mu.recs))
	if s.mu.closed || off <= s.mu.first {
		return
	}
	if off > end {
		off = end
	}
	s.mu.recs = append([]*logstore.Record(nil), s.mu.recs[off-s.mu.first:]...)
	s.mu.first = off
	close(s.mu.changed)
	s.mu.changed = make(chan struct{})
}

// records returns a copy of the committed records.
func (s *memStream) records() []*logstore.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*logstore.Record(nil), s.mu.recs...)
}

// submitted is the number of AppendAsync calls so far.
func (s *memStream) submitted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.submitted
}

// waitAppends waits until at least n AppendAsync calls were made (held or
// not). The timeout only stops a broken test from hanging.
func (s *memStream) waitAppends(tb testing.TB, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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

// waitRecords waits until at least n records are committed and returns them.
func (s *memStream) waitRecords(tb testing.TB, n int) []*logstore.Record {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ch := s.Changed()
		if recs := s.records(); len(recs) >= n {
			return recs
		}
		select {
		case <-ch:
		case <-ctx.Done():
			tb.Fatalf("memlog %s: %d records committed, want %d", s.name, len(s.records()), n)
		}
	}
}

func (s *memStream) close() {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return
	}
	s.mu.closed = true
	close(s.mu.changed) // stays closed: Changed of a closed stream never blocks
	s.mu.Unlock()
	close(s.stop)
	<-s.done
}

// TestMemLog_Contract checks the test double itself against log.go, so the
// broker tests built on it are not fooled by it.
func TestMemLog_Contract(t *testing.T) {
	l := newMemLog(t, "a=sensors/#", "b=sensors/+/power", "c=x")
	if got := l.Route("sensors/1/power"); got == nil || got.Name() != "b" {
		t.Fatalf("Route(sensors/1/power) = %v, want b", got)
	}
	if got := l.Route("sensors/1/temp"); got == nil || got.Name() != "a" {
		t.Fatalf("Route(sensors/1/temp) = %v, want a", got)
	}
	if got := l.Route("other"); got != nil {
		t.Fatalf("Route(other) = %s, want nil", got.Name())
	}
	s := l.stream(t, "a")
	ch := s.Changed()
	s.hold()
	type res struct {
		first uint64
		err   error
	}
	results := make(chan res, 3)
	for i := 0; i < 3; i++ {
		s.AppendAsync([]*logstore.Record{{Topic: "sensors/x"}, {Topic: "sensors/y"}}, func(first uint64, err error) {
			results <- res{first, err}
		})
	}
	s.waitAppends(t, 3)
	select {
	case <-ch:
		t.Fatal("Changed closed while appends are held")
	default:
	}
	if got := s.Committed(); got != 0 {
		t.Fatalf("Committed while held = %d, want 0", got)
	}
	s.release()
	for i := 0; i < 3; i++ {
		r := <-results
		if r.err != nil || r.first != uint64(2*i) {
			t.Fatalf("append %d: first %d err %v, want %d nil", i, r.first, r.err, 2*i)
		}
	}
	<-ch
	recs, err := s.Read(1, 10, 1<<20)
	if err != nil || len(recs) != 5 || recs[0].Offset != 1 {
		t.Fatalf("Read(1) = %d records, err %v", len(recs), err)
	}
	if recs, err := s.Read(6, 10, 1<<20); err != nil || len(recs) != 0 {
		t.Fatalf("Read(Committed) = %v, %v; want empty, nil", recs, err)
	}
	if _, err := s.Read(7, 10, 1<<20); !errors.Is(err, errMemOutOfRange) {
		t.Fatalf("Read past end: err %v, want out of range", err)
	}
	s.fail(errors.New("disk full"))
	s.AppendAsync([]*logstore.Record{{Topic: "sensors/z"}}, func(first uint64, err error) { results <- res{first, err} })
	if r := <-results; r.err == nil {
		t.Fatal("append succeeded while failing")
	}
	s.fail(nil)
	s.trim(2)
	if _, err := s.Read(1, 10, 1<<20); !errors.Is(err, errMemOutOfRange) {
		t.Fatalf("Read below first: err %v, want out of range", err)
	}
}
