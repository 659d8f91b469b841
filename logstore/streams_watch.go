package logstore

import "sync"

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
	ch := make(chan StreamEvent)
	st.changes.Lock()
	defer st.changes.Unlock()
	if st.changes.closed {
		close(ch)
		return ch, func() {}
	}
	w := &watcher{ch: ch, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	for _, s := range st.set.Load().streams {
		w.queue = append(w.queue, StreamEvent{Kind: StreamAdded, Stream: s})
	}
	w.wake <- struct{}{}
	if st.changes.watchers == nil {
		st.changes.watchers = map[*watcher]struct{}{}
	}
	st.changes.watchers[w] = struct{}{}
	st.wg.Add(1)
	go w.run(st)
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			close(w.stop)
			<-w.done
		})
	}
}

// watcher is one Watch: a queue the store appends to under changes, and
// a goroutine that hands it to ch.
type watcher struct {
	mu    sync.Mutex
	queue []StreamEvent
	ch    chan StreamEvent
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

// publish queues ev for every watcher. The caller holds st.changes.
func (st *Store) publish(ev StreamEvent) {
	for w := range st.changes.watchers {
		w.mu.Lock()
		w.queue = append(w.queue, ev)
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// run hands the queue to ch until cancel or Close, then closes ch.
func (w *watcher) run(st *Store) {
	defer st.wg.Done()
	defer close(w.done)
	defer close(w.ch)
	defer func() {
		st.changes.Lock()
		delete(st.changes.watchers, w)
		st.changes.Unlock()
	}()
	for {
		select {
		case <-w.stop:
			return
		case <-st.stopping:
			return
		case <-w.wake:
		}
		for {
			w.mu.Lock()
			if len(w.queue) == 0 {
				w.queue = nil
				w.mu.Unlock()
				break
			}
			ev := w.queue[0]
			w.queue = w.queue[1:]
			w.mu.Unlock()
			select {
			case w.ch <- ev:
			case <-w.stop:
				return
			case <-st.stopping:
				return
			}
		}
	}
}
