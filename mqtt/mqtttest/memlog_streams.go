package mqtttest

import (
	"fmt"
	"slices"

	"github.com/peatmq/peat/logstore"
)

// memSet is a MemLog's streams at one moment, never changed once
// published (as logstore's streamSet).
type memSet struct {
	streams []*MemStream
	byName  map[string]*MemStream
	router  *logstore.Router
}

// newMemSet checks names and filters (no name twice, no filter in two
// streams) and builds the router.
func newMemSet(streams []*MemStream) (*memSet, error) {
	set := &memSet{streams: streams, byName: make(map[string]*MemStream, len(streams))}
	filters := make([][]string, len(streams))
	for i, s := range streams {
		if set.byName[s.name] != nil {
			return nil, fmt.Errorf("memlog: stream %q twice: %w", s.name, logstore.ErrInvalidConfig)
		}
		set.byName[s.name] = s
		filters[i] = s.filters
	}
	var err error
	if set.router, err = logstore.NewRouter(filters); err != nil {
		return nil, fmt.Errorf("memlog: %w: %w", logstore.ErrInvalidConfig, err)
	}
	return set, nil
}

// MemEvent is a stream added to or removed from a MemLog.
type MemEvent struct {
	Kind   logstore.StreamEventKind
	Stream *MemStream
}

// AddStream adds the stream of a "name=filter[,filter]" spec, as
// logstore.Store.AddStream does: a name or filter another stream has is an
// error wrapping logstore.ErrInvalidConfig.
func (l *MemLog) AddStream(spec string) (*MemStream, error) {
	l.changes.Lock()
	defer l.changes.Unlock()
	if l.changes.closed {
		return nil, fmt.Errorf("memlog: add stream: %w", logstore.ErrClosed)
	}
	s, err := parseSpec(spec)
	if err != nil {
		return nil, err
	}
	set, err := newMemSet(append(slices.Clip(l.set.Load().streams), s))
	if err != nil {
		s.Close()
		return nil, err
	}
	l.set.Store(set)
	l.publish(MemEvent{Kind: logstore.StreamAdded, Stream: s})
	return s, nil
}

// RemoveStream removes the named stream and closes it (its appends and
// reads then fail with logstore.ErrClosed), as logstore.Store.RemoveStream
// does.
func (l *MemLog) RemoveStream(name string) error {
	l.changes.Lock()
	defer l.changes.Unlock()
	if l.changes.closed {
		return fmt.Errorf("memlog: remove stream %q: %w", name, logstore.ErrClosed)
	}
	cur := l.set.Load()
	s := cur.byName[name]
	if s == nil {
		return fmt.Errorf("memlog: remove stream %q: %w", name, logstore.ErrUnknownStream)
	}
	rest := slices.DeleteFunc(slices.Clone(cur.streams), func(o *MemStream) bool { return o == s })
	set, err := newMemSet(rest)
	if err != nil {
		return err // cannot happen: a subset of a valid set
	}
	l.set.Store(set)
	s.Close()
	l.publish(MemEvent{Kind: logstore.StreamRemoved, Stream: s})
	return nil
}

// Watch returns the log's stream changes, as logstore.Store.Watch: first an
// Added event per stream, then one per change; events queue, unbounded,
// until read. The channel closes after cancel (idempotent) or Close.
func (l *MemLog) Watch() (<-chan MemEvent, func()) {
	l.changes.Lock() // no AddStream or RemoveStream between the snapshot and the watch
	defer l.changes.Unlock()
	var initial []MemEvent
	for _, s := range l.set.Load().streams {
		initial = append(initial, MemEvent{Kind: logstore.StreamAdded, Stream: s})
	}
	return l.watchers.Watch(initial)
}

// publish queues ev for every watcher; the caller holds l.changes.
func (l *MemLog) publish(ev MemEvent) { l.watchers.Publish(ev) }
