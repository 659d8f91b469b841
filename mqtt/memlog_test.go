package mqtt

import (
	"sync"
	"testing"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// memLog adapts mqtttest.MemLog, the in-memory log whose contract package
// mqtttest/logtest checks, to Log, and gives this package's tests short
// unexported names for its steering methods. (mqtttest cannot import mqtt:
// see its package doc.)
type memLog struct {
	ml *mqtttest.MemLog
	mu sync.Mutex
	// One wrapper per stream, so Route, Streams, WatchStreams and stream
	// agree on identity.
	wrappers map[*mqtttest.MemStream]*memStream
}

var _ Log = (*memLog)(nil)

// newMemLog builds a memLog from "name=filter,filter" specs, e.g.
// newMemLog(t, "default=#") or newMemLog(t, "a=sensors/#", "b=meters/+/power").
// It closes at test cleanup.
func newMemLog(tb testing.TB, specs ...string) *memLog {
	tb.Helper()
	return &memLog{ml: mqtttest.NewMemLog(tb, specs...), wrappers: map[*mqtttest.MemStream]*memStream{}}
}

func (l *memLog) wrap(s *mqtttest.MemStream) *memStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.wrappers[s]
	if w == nil {
		w = &memStream{MemStream: s}
		l.wrappers[s] = w
	}
	return w
}

// Route returns the stream whose filter is the most specific match, or a
// nil interface.
func (l *memLog) Route(topic string) Stream {
	if s := l.ml.Route(topic); s != nil {
		return l.wrap(s)
	}
	return nil
}

func (l *memLog) Streams() []Stream {
	ss := l.ml.Streams()
	out := make([]Stream, len(ss))
	for i, s := range ss {
		out[i] = l.wrap(s)
	}
	return out
}

func (l *memLog) WatchStreams() (<-chan StreamEvent, func()) {
	in, cancel := l.ml.Watch()
	return ForwardStreamEvents(in, cancel, func(ev mqtttest.MemEvent) StreamEvent {
		return StreamEvent{Kind: ev.Kind, Stream: l.wrap(ev.Stream)}
	})
}

func (l *memLog) State() StateStore { return l.ml.State() }

func (l *memLog) Stream(name string) Stream {
	if s := l.ml.Lookup(name); s != nil {
		return l.wrap(s)
	}
	return nil
}

// stateValue returns the state stored under key.
func (l *memLog) stateValue(key string) ([]byte, bool) { return l.ml.State().Value(key) }

// streamStateValue returns the named stream's state under key (false when
// the log has no such stream).
func (l *memLog) streamStateValue(stream, key string) ([]byte, bool) {
	s := l.ml.Lookup(stream)
	if s == nil {
		return nil, false
	}
	return s.StateValue(key)
}

// stream returns the named stream, for test assertions and steering.
func (l *memLog) stream(tb testing.TB, name string) *memStream {
	tb.Helper()
	return l.wrap(l.ml.Stream(tb, name))
}

// memStream is a Stream with the steering methods under this package's
// tests' names.
type memStream struct {
	*mqtttest.MemStream
	stall struct {
		sync.Mutex
		ch chan struct{} // not nil: reads wait until it is closed
	}
}

// Read is the MemStream's, held while stallReads is in force.
func (s *memStream) Read(from uint64, max, maxBytes int) ([]*logstore.Record, error) {
	s.stall.Lock()
	ch := s.stall.ch
	s.stall.Unlock()
	if ch != nil {
		<-ch
	}
	return s.MemStream.Read(from, max, maxBytes)
}

// stallReads holds every read of the stream (the shared reader's, the
// retained follower's, cursors') until the returned func is called; test
// cleanup calls it too.
func (s *memStream) stallReads(tb testing.TB) (resume func()) {
	s.stall.Lock()
	ch := make(chan struct{})
	s.stall.ch = ch
	s.stall.Unlock()
	var once sync.Once
	resume = func() {
		once.Do(func() {
			s.stall.Lock()
			s.stall.ch = nil
			s.stall.Unlock()
			close(ch)
		})
	}
	tb.Cleanup(resume)
	return resume
}

var _ Stream = (*memStream)(nil)

func (s *memStream) hold()                            { s.Hold() }
func (s *memStream) release()                         { s.Release() }
func (s *memStream) fail(err error)                   { s.Fail(err) }
func (s *memStream) trim(off uint64)                  { s.Trim(off) }
func (s *memStream) records() []*logstore.Record      { return s.Records() }
func (s *memStream) submitted() int                   { return s.Submitted() }
func (s *memStream) waitAppends(tb testing.TB, n int) { tb.Helper(); s.WaitAppends(tb, n) }
func (s *memStream) waitRecords(tb testing.TB, n int) []*logstore.Record {
	tb.Helper()
	return s.WaitRecords(tb, n)
}
