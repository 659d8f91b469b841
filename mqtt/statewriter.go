package mqtt

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"
)

// stateWriter writes consumer state (group offsets, durable sessions) to the
// log's StateStore and its streams' own state from one goroutine, coalescing: a key changed many times
// between two writes is written once, with its last value. A write that
// someone waits for (an explicit commit, a session being saved at
// disconnect) goes out at once; progress from acknowledgements waits for the
// next write, at most interval after the previous one, so a consumer acking
// 50,000 messages a second costs a few small transactions a second, not
// 50,000 (SD cards wear out).
type stateWriter struct {
	log      Log
	logger   *slog.Logger
	interval time.Duration
	// onWritten, when not nil, is called for each key a successful write
	// stored (val nil: deleted), before the waiters.
	onWritten func(ref stateRef, val []byte)
	// sessions is where refs of siteSessionsStore go (SiteSessions).
	sessions StateStore

	wake chan struct{} // 1-buffered
	mu   struct {
		sync.Mutex
		dirty   map[stateRef]stateValue
		waiters []func(error)
		urgent  bool
		failing bool
	}
}

// stateBatch bounds the keys of one transaction (logstore allows 1024).
const stateBatch = 512

// stateRetryDelay is how long the writer waits after a failed write.
const stateRetryDelay = time.Second

// stateRef names one state entry: key in the named stream's own state, in
// the log's State when stream is "", in the site's SessionState when it
// is siteSessionsStore.
type stateRef struct{ stream, key string }

// siteSessionsStore names SiteSessions.SessionState in a stateRef (no
// stream name has a NUL).
const siteSessionsStore = "\x00sessions"

// stateValue is an entry's value at write time: nil deletes it; keep
// false writes nothing (a session this broker no longer holds).
type stateValue func() (val []byte, keep bool)

func newStateWriter(log Log, interval time.Duration, logger *slog.Logger, onWritten func(ref stateRef, val []byte)) *stateWriter {
	w := &stateWriter{log: log, logger: logger, interval: interval, onWritten: onWritten, wake: make(chan struct{}, 1)}
	w.mu.dirty = map[stateRef]stateValue{}
	return w
}

// put sets ref to val (nil deletes it) in the next write. done, when not
// nil, is called once that write has succeeded or failed, and makes it go
// out at once.
func (w *stateWriter) put(ref stateRef, val []byte, done func(error)) {
	w.putFunc(ref, func() ([]byte, bool) { return val, true }, done)
}

// putFunc is put with the value computed when it is written, for values
// that change often (a session's offsets).
func (w *stateWriter) putFunc(ref stateRef, val stateValue, done func(error)) {
	w.mu.Lock()
	w.mu.dirty[ref] = val
	if done != nil {
		w.mu.waiters = append(w.mu.waiters, done)
		w.mu.urgent = true
	}
	w.mu.Unlock()
	poke(w.wake)
}

// after calls done once the next write, which takes everything put
// before, has succeeded or failed, and makes it go out at once.
func (w *stateWriter) after(done func(error)) {
	w.mu.Lock()
	w.mu.waiters = append(w.mu.waiters, done)
	w.mu.urgent = true
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

// flush writes everything dirty, one transaction per store (the log's
// State, each stream's own) and stateBatch keys; it reports success. What
// is meant for a stream the log no longer has is dropped: its state went
// with it.
func (w *stateWriter) flush() bool {
	w.mu.Lock()
	dirty, waiters := w.mu.dirty, w.mu.waiters
	w.mu.dirty, w.mu.waiters, w.mu.urgent = map[stateRef]stateValue{}, nil, false
	w.mu.Unlock()
	if len(dirty) == 0 && len(waiters) == 0 {
		return true
	}
	byStore := map[string][]stateRef{}
	for ref := range dirty {
		byStore[ref.stream] = append(byStore[ref.stream], ref)
	}
	values := make(map[stateRef][]byte, len(dirty))
	failed := map[stateRef]stateValue{}
	var err error
	for name, refs := range byStore {
		var st StateStore = w.log.State()
		if name == siteSessionsStore {
			st = w.sessions
		} else if name != "" {
			s := w.log.Stream(name)
			if s == nil {
				continue // removed, and its state with it
			}
			st = s
		}
		for len(refs) > 0 {
			chunk := refs[:min(len(refs), stateBatch)]
			refs = refs[len(chunk):]
			puts, dels := map[string][]byte{}, []string(nil)
			got := make(map[stateRef][]byte, len(chunk))
			for _, ref := range chunk {
				v, keep := dirty[ref]()
				if !keep {
					continue
				}
				got[ref] = v
				if v == nil {
					dels = append(dels, ref.key)
				} else {
					puts[ref.key] = v
				}
			}
			if len(puts) == 0 && len(dels) == 0 {
				continue // nothing this broker may write
			}
			switch werr := st.WriteState(puts, dels); {
			case werr == nil:
				maps.Copy(values, got)
			case name != "" && name != siteSessionsStore && w.log.Stream(name) == nil:
				// removed while writing
			default:
				err = werr
				for _, ref := range chunk {
					failed[ref] = dirty[ref]
				}
			}
		}
	}
	w.mu.Lock()
	for ref, v := range failed { // keep newer values written meanwhile
		if _, newer := w.mu.dirty[ref]; !newer {
			w.mu.dirty[ref] = v
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
	if w.onWritten != nil {
		for ref, v := range values {
			w.onWritten(ref, v)
		}
	}
	for _, done := range waiters {
		done(err)
	}
	return err == nil
}
