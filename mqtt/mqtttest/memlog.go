package mqtttest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/peatmq/peat/logstore"
)

// MemLog is an in-memory offset log for tests, keeping the contract written
// in mqtt/log.go (and checked by package logtest): one appender goroutine
// per stream calls done in AppendAsync order, a record is visible to Read
// once its done is called, Changed is closed on every commit and on close.
// Its methods have logstore.Store's shape: see the package doc for how it
// becomes an mqtt.Log.
//
// Streams can be added and removed while it runs (AddStream, RemoveStream,
// Watch: memlog_streams.go).
type MemLog struct {
	set   atomic.Pointer[memSet]
	state *MemState

	changes struct { // serializes AddStream and RemoveStream, and their events
		sync.Mutex
		closed bool
	}
	watchers logstore.Watchers[MemEvent]
}

// NewMemLog builds a MemLog from "name=filter,filter" specs, e.g.
// NewMemLog(t, "default=#") or NewMemLog(t, "a=sensors/#", "b=meters/+/power").
// It closes at test cleanup.
func NewMemLog(tb testing.TB, specs ...string) *MemLog {
	tb.Helper()
	l := &MemLog{state: &MemState{}}
	l.state.mu.m = map[string][]byte{}
	var streams []*MemStream
	for _, spec := range specs {
		s, err := parseSpec(spec)
		if err != nil {
			tb.Fatal(err)
		}
		streams = append(streams, s)
	}
	set, err := newMemSet(streams)
	if err != nil {
		for _, s := range streams {
			s.Close()
		}
		tb.Fatal(err)
	}
	l.set.Store(set)
	tb.Cleanup(l.Close)
	return l
}

// parseSpec makes the stream of a "name=filter[,filter]" spec.
func parseSpec(spec string) (*MemStream, error) {
	name, fs, ok := strings.Cut(spec, "=")
	if !ok || name == "" || fs == "" {
		return nil, fmt.Errorf("memlog: bad stream spec %q, want name=filter[,filter]", spec)
	}
	return newMemStream(name, strings.Split(fs, ",")), nil
}

// Route returns the stream with the most specific filter matching topic
// (the rule written at mqtt.Log.Route), or nil. It routes with logstore's
// Router, as the store does: one matcher for both.
func (l *MemLog) Route(topic string) *MemStream {
	set := l.set.Load()
	if i := set.router.Route(topic); i >= 0 {
		return set.streams[i]
	}
	return nil
}

// Streams lists the streams in spec order, then those added, in the order
// they were added.
func (l *MemLog) Streams() []*MemStream { return slices.Clone(l.set.Load().streams) }

// State is the log's consumer state.
func (l *MemLog) State() *MemState { return l.state }

// Stream returns the named stream, for assertions and steering; it fails
// the test when there is none.
func (l *MemLog) Stream(tb testing.TB, name string) *MemStream {
	tb.Helper()
	s := l.set.Load().byName[name]
	if s == nil {
		tb.Fatalf("memlog: no stream %q", name)
	}
	return s
}

// Lookup returns the named stream, or nil.
func (l *MemLog) Lookup(name string) *MemStream { return l.set.Load().byName[name] }

// Close closes every stream (queued appends fail with logstore.ErrClosed)
// and the state. It is idempotent.
func (l *MemLog) Close() {
	l.changes.Lock()
	l.changes.closed = true
	l.changes.Unlock()
	l.watchers.Close()
	for _, s := range l.set.Load().streams {
		s.Close()
	}
	l.state.mu.Lock()
	l.state.mu.closed = true
	l.state.mu.Unlock()
}

// MemState is an in-memory StateStore.
type MemState struct {
	mu struct {
		sync.Mutex
		m      map[string][]byte
		closed bool
	}
}

// WriteState sets puts and deletes dels, atomically. Like logstore, it
// refuses more than logstore.MaxStateWrite entries, and fails once closed.
func (s *MemState) WriteState(puts map[string][]byte, dels []string) error {
	if n := len(puts) + len(dels); n > logstore.MaxStateWrite {
		return fmt.Errorf("memlog: write state: %d entries, at most %d", n, logstore.MaxStateWrite)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return fmt.Errorf("memlog: write state: %w", logstore.ErrClosed)
	}
	for k, v := range puts {
		s.mu.m[k] = slices.Clone(v)
	}
	for _, k := range dels {
		delete(s.mu.m, k)
	}
	return nil
}

// LoadState calls fn for every entry whose key starts with prefix, in key
// order, and stops at fn's first error.
func (s *MemState) LoadState(prefix string, fn func(key string, val []byte) error) error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return fmt.Errorf("memlog: load state: %w", logstore.ErrClosed)
	}
	var keys []string
	for k := range s.mu.m {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	s.mu.Unlock()
	slices.Sort(keys)
	for _, k := range keys {
		s.mu.Lock()
		v, ok := s.mu.m[k]
		s.mu.Unlock()
		if !ok {
			continue // deleted meanwhile
		}
		if err := fn(k, v); err != nil {
			return fmt.Errorf("memlog: load state %q: %w", k, err)
		}
	}
	return nil
}

// Value returns the state stored under key, for assertions.
func (s *MemState) Value(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.mu.m[key]
	return slices.Clone(v), ok
}
