package logstore

import (
	"slices"
	"sync"
)

// Watchers hands events to any number of watchers, each in order, and never
// waits for one: every watcher has its own queue, which grows while it does
// not read (changes are rare; a watcher that stops reading must cancel), and
// a goroutine that feeds its channel. Store.Watch and mqtttest's MemLog.Watch
// are built on it. The zero value is ready; Close ends every watcher.
type Watchers[E any] struct {
	mu      sync.Mutex
	set     map[*eventWatcher[E]]struct{}
	closed  bool
	closing chan struct{}
	wg      sync.WaitGroup
}

type eventWatcher[E any] struct {
	mu    sync.Mutex
	queue []E
	ch    chan E
	wake  chan struct{} // cap 1
	stop  chan struct{}
	done  chan struct{}
}

// Watch returns a channel that gets initial, then every event published
// after, and a cancel (idempotent) that returns once the channel is
// closed. After Close the channel is closed at once. A caller that must not
// miss an event between taking initial and watching holds the lock it
// publishes under across both.
func (ws *Watchers[E]) Watch(initial []E) (events <-chan E, cancel func()) {
	ch := make(chan E)
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		close(ch)
		return ch, func() {}
	}
	ws.initLocked()
	w := &eventWatcher[E]{queue: slices.Clone(initial), ch: ch, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	w.wake <- struct{}{}
	ws.set[w] = struct{}{}
	ws.wg.Add(1)
	go w.run(ws)
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			close(w.stop)
			<-w.done
		})
	}
}

// Publish queues ev for every watcher.
func (ws *Watchers[E]) Publish(ev E) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for w := range ws.set {
		w.mu.Lock()
		w.queue = append(w.queue, ev)
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Close ends every watcher (their channels close) and returns once their
// goroutines have; later Watch calls get a closed channel.
func (ws *Watchers[E]) Close() {
	ws.mu.Lock()
	if !ws.closed {
		ws.closed = true
		ws.initLocked()
		close(ws.closing)
	}
	ws.mu.Unlock()
	ws.wg.Wait()
}

func (ws *Watchers[E]) initLocked() {
	if ws.set == nil {
		ws.set = map[*eventWatcher[E]]struct{}{}
		ws.closing = make(chan struct{})
	}
}

// run hands the queue to ch until cancel or Close, then closes ch.
func (w *eventWatcher[E]) run(ws *Watchers[E]) {
	defer ws.wg.Done()
	defer close(w.done)
	defer close(w.ch)
	defer func() {
		ws.mu.Lock()
		delete(ws.set, w)
		ws.mu.Unlock()
	}()
	for {
		select {
		case <-w.stop:
			return
		case <-ws.closing:
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
			case <-ws.closing:
				return
			}
		}
	}
}
