package logstore

// StreamEventKind says what happened to a stream.
type StreamEventKind int

// Stream events.
const (
	StreamAdded StreamEventKind = iota + 1
	StreamRemoved
)

func (k StreamEventKind) String() string {
	switch k {
	case StreamAdded:
		return "added"
	case StreamRemoved:
		return "removed"
	}
	return "unknown"
}

// StreamEvent is a stream added to or removed from the store.
type StreamEvent struct {
	Kind   StreamEventKind
	Stream *Stream
}

// Watch returns a channel of the store's stream changes, and a cancel
// that ends them. The channel first gets StreamAdded for every stream the
// store has (in Streams order), then each AddStream and RemoveStream, in the
// order they happened: a watcher needs no separate Streams call and misses
// nothing. A StreamRemoved comes once the stream's appender has stopped and
// before its records are deleted.
//
// The store never waits for a watcher: events wait in the watcher's own
// queue, which grows while nobody reads (a change is rare; a watcher that
// never reads must cancel). The channel is closed after cancel (idempotent,
// it returns once the watcher's goroutine has) or Close.
func (st *Store) Watch() (events <-chan StreamEvent, cancel func()) {
	st.changes.Lock() // no AddStream or RemoveStream between the snapshot and the watch
	defer st.changes.Unlock()
	var initial []StreamEvent
	for _, s := range st.set.Load().streams {
		initial = append(initial, StreamEvent{Kind: StreamAdded, Stream: s})
	}
	return st.watchers.Watch(initial)
}

// publish queues ev for every watcher. The caller holds st.changes.
func (st *Store) publish(ev StreamEvent) { st.watchers.Publish(ev) }
