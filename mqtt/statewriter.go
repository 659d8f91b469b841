package mqtt

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// stateWriter writes consumer state (group offsets, durable sessions) to the
// StateStore from one goroutine, coalescing: a key changed many times
// between two writes is written once, with its last value. A write that
// someone waits for (an explicit commit, a session being saved at
// disconnect) goes out at once; progress from acknowledgements waits for the
// next write, at most interval after the previous one, so a consumer acking
// 50,000 messages a second costs a few small transactions a second, not
// 50,000 (SD cards wear out).
type stateWriter struct {
	st       StateStore
	logger   *slog.Logger
	interval time.Duration
	// onWritten, when not nil, is called for each key a successful write
	// stored (val nil: deleted), before the waiters.
	onWritten func(key string, val []byte)

	wake chan struct{} // 1-buffered
	mu   struct {
		sync.Mutex
		dirty   map[string]func() []byte // the value at write time; nil deletes
		waiters []func(error)
		urgent  bool
		failing bool
	}
}

// stateBatch bounds the keys of one transaction (logstore allows 1024).
const stateBatch = 512

// stateRetryDelay is how long the writer waits after a failed write.
const stateRetryDelay = time.Second

func newStateWriter(st StateStore, interval time.Duration, logger *slog.Logger, onWritten func(key string, val []byte)) *stateWriter {
	w := &stateWriter{st: st, logger: logger, interval: interval, onWritten: onWritten, wake: make(chan struct{}, 1)}
	w.mu.dirty = map[string]func() []byte{}
	return w
}

// put sets key to val (nil deletes it) in the next write. done, when not
// nil, is called once that write has succeeded or failed, and makes it go
// out at once.
func (w *stateWriter) put(key string, val []byte, done func(error)) {
	w.putFunc(key, func() []byte { return val }, done)
}

// putFunc is put with the value computed when it is written, for values
// that change often (a session's offsets).
func (w *stateWriter) putFunc(key string, val func() []byte, done func(error)) {
	w.mu.Lock()
	w.mu.dirty[key] = val
	if done != nil {
		w.mu.waiters = append(w.mu.waiters, done)
		w.mu.urgent = true
	}
	w.mu.Unlock()
	poke(w.wake)
}

// run writes until ctx ends, then writes what is left once.
func (w *stateWriter) run(ctx context.Context) {
	last := time.Time{}
	for {
		select {
		case <-w.wake:
		case <-ctx.Done():
			w.flush()
			return
		}
		w.mu.Lock()
		urgent := w.mu.urgent
		w.mu.Unlock()
		if wait := w.interval - time.Since(last); !urgent && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-w.wake: // perhaps urgent now; write what there is
				t.Stop()
			case <-ctx.Done():
				t.Stop()
				w.flush()
				return
			}
		}
		last = time.Now()
		if !w.flush() {
			if !deliverySleep(ctx, stateRetryDelay) {
				w.flush()
				return
			}
			poke(w.wake)
		}
	}
}

// flush writes everything dirty in one transaction; it reports success.
func (w *stateWriter) flush() bool {
	w.mu.Lock()
	dirty, waiters := w.mu.dirty, w.mu.waiters
	w.mu.dirty, w.mu.waiters, w.mu.urgent = map[string]func() []byte{}, nil, false
	w.mu.Unlock()
	if len(dirty) == 0 && len(waiters) == 0 {
		return true
	}
	var err error
	puts, dels := map[string][]byte{}, []string(nil)
	values := make(map[string][]byte, len(dirty))
	n := 0
	for k, f := range dirty {
		v := f()
		values[k] = v
		if v == nil {
			dels = append(dels, k)
		} else {
			puts[k] = v
		}
		if n++; n%stateBatch == 0 || n == len(dirty) {
			if err = w.st.WriteState(puts, dels); err != nil {
				break
			}
			puts, dels = map[string][]byte{}, nil
		}
	}
	w.mu.Lock()
	if err != nil {
		for k, v := range dirty { // keep newer values written meanwhile
			if _, newer := w.mu.dirty[k]; !newer {
				w.mu.dirty[k] = v
			}
		}
	}
	was := w.mu.failing
	w.mu.failing = err != nil
	w.mu.Unlock()
	switch {
	case err != nil && !was:
		w.logger.Error("consumer state: write failed; retrying", attrErr, err)
	case err == nil && was:
		w.logger.Info("consumer state: writes succeed again")
	}
	if err == nil && w.onWritten != nil {
		for k, v := range values {
			w.onWritten(k, v)
		}
	}
	for _, done := range waiters {
		done(err)
	}
	return err == nil
}
