package logstore

import (
	"bytes"
	"errors"
	"fmt"

	badger "github.com/dgraph-io/badger/v4"
)

// The key-value space: a few durable keys beside the streams, for the
// cluster controller's Raft log and stable store (DESIGN.md, Cluster: one
// storage engine on the node, not a second one).
//
//	key-value   'w' <key>   -> value
//
// Keys are the caller's bytes; 'w' sorts after the records, so its writes
// stay out of the record tables' way (layout.go). Every write takes the
// store's write lock (held off while DropPrefix runs) and is synced before
// it returns, even when every stream has interval durability: Raft must
// not acknowledge an entry a power cut can take back.
const tagKV = 'w'

// KV is one key and its value.
type KV struct {
	Key, Value []byte
}

func kvKey(k []byte) []byte { return append([]byte{tagKV}, k...) }

// KVGet returns a copy of key's value, or ErrNotFound (unwrapped, see
// ErrNotFound) when there is none.
func (st *Store) KVGet(key []byte) ([]byte, error) {
	var val []byte
	err := st.kvView(func(txn *badger.Txn) error {
		item, err := txn.Get(kvKey(key))
		if err != nil {
			return err
		}
		val, err = item.ValueCopy(nil)
		return err
	})
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		return nil, ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("logstore: get %q: %w", key, err)
	}
	return val, nil
}

// KVSet sets key to val, durably.
func (st *Store) KVSet(key, val []byte) error {
	return st.KVWrite([]KV{{key, val}}, nil)
}

// KVDelete deletes key, durably; a missing key is not an error.
func (st *Store) KVDelete(key []byte) error {
	return st.KVWrite(nil, [][]byte{key})
}

// KVWrite sets puts and deletes dels in one transaction, durably (synced
// before it returns, whatever the streams' durability). A write larger
// than one Badger transaction fails with ErrRecordTooLarge and writes
// nothing.
func (st *Store) KVWrite(puts []KV, dels [][]byte) error {
	st.life.RLock()
	defer st.life.RUnlock()
	if st.life.closed {
		return fmt.Errorf("logstore: key-value write: %w", ErrClosed)
	}
	st.writeMu.RLock()
	defer st.writeMu.RUnlock()
	err := st.db.Update(func(txn *badger.Txn) error {
		for _, kv := range puts {
			if err := txn.Set(kvKey(kv.Key), kv.Value); err != nil {
				return err
			}
		}
		for _, k := range dels {
			if err := txn.Delete(kvKey(k)); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, badger.ErrTxnTooBig) {
		err = fmt.Errorf("%w: %d puts and %d deletes in one write", ErrRecordTooLarge, len(puts), len(dels))
	}
	if err == nil && st.logSync != nil { // interval durability: no SyncWrites
		err = st.logSync.sync()
	}
	if err != nil {
		return fmt.Errorf("logstore: key-value write: %w", err)
	}
	return nil
}

// KVScan calls fn for every key starting with prefix, in key order (in
// reverse order with reverse), until fn returns an error, which KVScan
// returns. fn must not keep key or val.
func (st *Store) KVScan(prefix []byte, reverse bool, fn func(key, val []byte) error) error {
	return st.kvView(func(txn *badger.Txn) error {
		p := kvKey(prefix)
		it := txn.NewIterator(badger.IteratorOptions{Reverse: reverse})
		defer it.Close()
		seek := p
		if reverse {
			// The keys with prefix p are those in [p, succ(p)): a reverse
			// Seek lands on the last key at or below succ(p).
			seek = prefixEnd(p)
		}
		for it.Seek(seek); it.Valid(); it.Next() {
			item := it.Item()
			if reverse && bytes.Equal(item.Key(), seek) {
				continue
			}
			if !bytes.HasPrefix(item.Key(), p) {
				break
			}
			if err := item.Value(func(v []byte) error { return fn(item.Key()[1:], v) }); err != nil {
				return err
			}
		}
		return nil
	})
}

// prefixEnd is the first key after every key that starts with p (p does
// not end in 0xff bytes only: it starts with tagKV).
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return end
}

func (st *Store) kvView(fn func(txn *badger.Txn) error) error {
	st.life.RLock()
	defer st.life.RUnlock()
	if st.life.closed {
		return fmt.Errorf("logstore: key-value read: %w", ErrClosed)
	}
	return st.view(fn)
}
