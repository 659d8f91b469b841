package logstore

import (
	"fmt"

	badger "github.com/dgraph-io/badger/v4"
)

// Consumer state: small values that readers of the log keep next to it, in
// the same database (consumer groups' committed offsets, durable MQTT
// sessions). Keys are opaque strings chosen by the caller:
//
//	state   'k' <key>   -> value
//
// A WriteState is one Badger transaction, as durable as the store's appends:
// fsynced before it returns when any stream uses fsync durability, else
// synced within SyncInterval.

// MaxStateWrite bounds the entries of one WriteState, far below Badger's
// per-transaction limit.
const MaxStateWrite = 1024

// WriteState sets puts and deletes dels, atomically.
func (st *Store) WriteState(puts map[string][]byte, dels []string) error {
	if n := len(puts) + len(dels); n > MaxStateWrite {
		return fmt.Errorf("logstore: write state: %d entries, at most %d", n, MaxStateWrite)
	}
	st.life.RLock()
	defer st.life.RUnlock()
	if st.life.closed {
		return fmt.Errorf("logstore: write state: %w", ErrClosed)
	}
	st.writeMu.RLock()
	defer st.writeMu.RUnlock()
	err := st.db.Update(func(txn *badger.Txn) error {
		for k, v := range puts {
			if err := txn.Set(stateKey(k), v); err != nil {
				return err
			}
		}
		for _, k := range dels {
			if err := txn.Delete(stateKey(k)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("logstore: write state: %w", err)
	}
	return nil
}

// LoadState calls fn for every state entry whose key starts with prefix, in
// key order. fn must not keep val.
func (st *Store) LoadState(prefix string, fn func(key string, val []byte) error) error {
	st.life.RLock()
	defer st.life.RUnlock()
	if st.life.closed {
		return fmt.Errorf("logstore: load state: %w", ErrClosed)
	}
	return st.view(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = stateKey(prefix)
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			key := string(item.Key()[1:])
			if err := item.Value(func(val []byte) error { return fn(key, val) }); err != nil {
				return fmt.Errorf("logstore: load state %q: %w", key, err)
			}
		}
		return nil
	})
}

func stateKey(k string) []byte { return append([]byte{tagState}, k...) }
