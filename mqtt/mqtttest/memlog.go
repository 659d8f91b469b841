package mqtttest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/peatmq/peat/logstore"
)

// MemLog is an in-memory offset log for tests, keeping the contract written
// in mqtt/log.go (and checked by package logtest): one appender goroutine
// per stream calls done in AppendAsync order, a record is visible to Read
// once its done is called, Changed is closed on every commit and on close.
// Its methods have logstore.Store's shape: see the package doc for how it
// becomes an mqtt.Log.
type MemLog struct {
	streams []*MemStream
	router  *logstore.Router
	state   *MemState
}

// NewMemLog builds a MemLog from "name=filter,filter" specs, e.g.
// NewMemLog(t, "default=#") or NewMemLog(t, "a=sensors/#", "b=meters/+/power").
// It closes at test cleanup.
func NewMemLog(tb testing.TB, specs ...string) *MemLog {
	tb.Helper()
	l := &MemLog{state: &MemState{}}
	l.state.mu.m = map[string][]byte{}
	var filters [][]string
	for _, spec := range specs {
		name, fs, ok := strings.Cut(spec, "=")
		if !ok || name == "" || fs == "" {
			tb.Fatalf("memlog: bad stream spec %q, want name=filter[,filter]", spec)
		}
		l.streams = append(l.streams, newMemStream(name, strings.Split(fs, ",")))
		filters = append(filters, strings.Split(fs, ","))
	}
	var err error
	if l.router, err = logstore.NewRouter(filters); err != nil {
		tb.Fatalf("memlog: %v", err)
	}
	tb.Cleanup(l.Close)
	return l
}

// Route returns the stream with the most specific filter matching topic
// (the rule written at mqtt.Log.Route), or nil. It routes with logstore's
// Router, as the store does: one matcher for both.
func (l *MemLog) Route(topic string) *MemStream {
	if i := l.router.Route(topic); i >= 0 {
		return l.streams[i]
	}
	return nil
}

// Streams lists the streams in spec order.
func (l *MemLog) Streams() []*MemStream { return slices.Clone(l.streams) }

// State is the log's consumer state.
func (l *MemLog) State() *MemState { return l.state }

// Stream returns the named stream, for assertions and steering; it fails
// the test when there is none.
func (l *MemLog) Stream(tb testing.TB, name string) *MemStream {
	tb.Helper()
	for _, s := range l.streams {
		if s.name == name {
			return s
		}
	}
	tb.Fatalf("memlog: no stream %q", name)
	return nil
}

// Close closes every stream (queued appends fail with logstore.ErrClosed)
// and the state. It is idempotent.
func (l *MemLog) Close() {
	for _, s := range l.streams {
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
