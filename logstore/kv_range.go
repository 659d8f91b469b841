package logstore

import (
	"bytes"

	badger "github.com/dgraph-io/badger/v4"
)

// KVScanRange calls fn for every key k with start <= k < end, in key order
// (from the end down with reverse), until fn returns an error, which
// KVScanRange returns. A nil end means no upper bound. It seeks straight to
// the range: the Raft log store finds its first and last index, and
// deletes a conflicting suffix, without walking the whole log. fn must not
// keep key or val.
func (st *Store) KVScanRange(start, end []byte, reverse bool, fn func(key, val []byte) error) error {
	lo := kvKey(start)
	var hi []byte
	if end != nil {
		hi = kvKey(end)
	} else {
		hi = []byte{tagKV + 1}
	}
	if bytes.Compare(lo, hi) >= 0 {
		return nil
	}
	return st.kvView(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Reverse: reverse})
		defer it.Close()
		seek := lo
		if reverse {
			seek = hi // a reverse Seek lands on the last key at or below hi
		}
		for it.Seek(seek); it.Valid(); it.Next() {
			item := it.Item()
			k := item.Key()
			if reverse && bytes.Compare(k, hi) >= 0 {
				continue
			}
			if bytes.Compare(k, lo) < 0 || bytes.Compare(k, hi) >= 0 {
				break
			}
			if err := item.Value(func(v []byte) error { return fn(k[1:], v) }); err != nil {
				return err
			}
		}
		return nil
	})
}
