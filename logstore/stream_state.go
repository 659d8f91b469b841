package logstore

import (
	"fmt"
	"sync"

	badger "github.com/dgraph-io/badger/v4"
)

// A stream's own consumer state: the positions its readers keep in it
// (consumer groups' committed offsets, durable sessions' cursors). They
// belong to the stream, not to the node: they are removed with it, and a
// cluster replicates them with the stream so that whichever node leads it
// serves them.
//
//	stream state   'v' <id:4> <key>   -> value
//
// 'v' sorts after the records, like every key a commit rewrites (layout.go).
// Writes are as durable as the store's state writes (state.go).
const tagStreamState = 'v'

func streamStateKey(id uint32, k string) []byte { return append(prefix(tagStreamState, id), k...) }

// WriteState sets puts and deletes dels in the stream's state, atomically,
// with WriteState's durability and limit. On a removed stream it fails with
// ErrStreamRemoved.
func (s *Stream) WriteState(puts map[string][]byte, dels []string) error {
	if n := len(puts) + len(dels); n > MaxStateWrite {
		return fmt.Errorf("logstore: write state of %s: %d entries, at most %d", s.name, n, MaxStateWrite)
	}
	st := s.st
	st.life.RLock()
	defer st.life.RUnlock()
	switch {
	case st.life.closed:
		return fmt.Errorf("logstore: write state of %s: %w", s.name, ErrClosed)
	case s.removed.Load():
		return fmt.Errorf("logstore: write state of %s: %w", s.name, errRemoved)
	}
	st.writeMu.RLock()
	defer st.writeMu.RUnlock()
	err := st.db.Update(func(txn *badger.Txn) error {
		for k, v := range puts {
			if err := txn.Set(streamStateKey(s.id, k), v); err != nil {
				return err
			}
		}
		for _, k := range dels {
			if err := txn.Delete(streamStateKey(s.id, k)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("logstore: write state of %s: %w", s.name, err)
	}
	return nil
}

// LoadState calls fn for every entry of the stream's state whose key
// starts with prefix, in key order. fn must not keep val.
func (s *Stream) LoadState(prefix string, fn func(key string, val []byte) error) error {
	st := s.st
	st.life.RLock()
	defer st.life.RUnlock()
	switch {
	case st.life.closed:
		return fmt.Errorf("logstore: load state of %s: %w", s.name, ErrClosed)
	case s.removed.Load():
		return fmt.Errorf("logstore: load state of %s: %w", s.name, errRemoved)
	}
	skip := len(streamStateKey(s.id, ""))
	return st.view(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = streamStateKey(s.id, prefix)
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			key := string(item.Key()[skip:])
			if err := item.Value(func(val []byte) error { return fn(key, val) }); err != nil {
				return fmt.Errorf("logstore: load state of %s, %q: %w", s.name, key, err)
			}
		}
		return nil
	})
}

// StateMoved returns a channel closed when the stream's state was replaced
// by something other than this node's WriteState, so that a reader caching
// it must load it again. A single-node store never does that: the channel
// never closes. (A cluster's stream closes it when leadership moves to this
// node or a replica applies the leader's state.)
func (s *Stream) StateMoved() <-chan struct{} { return neverMoved }

var neverMoved = make(chan struct{})

// claims: which reader holds a key of a stream (a consumer group's single
// active consumer). They last as long as the process: a claim is a
// connected consumer, and no consumer is connected after a restart.
type claims struct {
	mu sync.Mutex
	m  map[string]string // key -> holder
}

// Claim makes holder the holder of key, unless another holder has it: ok
// is false then, and current names that holder. A holder claiming a key it
// holds succeeds.
func (s *Stream) Claim(key, holder string) (ok bool, current string) {
	s.claims.mu.Lock()
	defer s.claims.mu.Unlock()
	if h, held := s.claims.m[key]; held && h != holder {
		return false, h
	}
	if s.claims.m == nil {
		s.claims.m = map[string]string{}
	}
	s.claims.m[key] = holder
	return true, holder
}

// Unclaim gives key up if holder holds it.
func (s *Stream) Unclaim(key, holder string) {
	s.claims.mu.Lock()
	defer s.claims.mu.Unlock()
	if s.claims.m[key] == holder {
		delete(s.claims.m, key)
	}
}
