package logstore

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// Key layout versions (doc.go draws the current one).
//
// Layout 1 tagged chunk stats 'c', consumer state 'k' and meta keys 'm':
// every key a commit rewrites sorted before the records. Badger flushes a
// memtable into one level-0 table spanning its smallest to its largest key,
// and a compaction into the base level rewrites every base-level table that
// span overlaps (it never moves a table down unchanged, levels.go:1496). With
// the current chunk's stats in every commit, each level-0 table ran from
// 'c' to the newest record, overlapped the whole base level, and every
// level-0 compaction rewrote all of it: 1,271-1,362 bytes written per
// 179-byte record in a 1M-record pi-zero ingest with records inline in the
// tables (scripts/bench-pi.sh, 2026-12-02).
//
// Layout 2 moves those keys after the records (tags 's', 't', 'x'), so a
// level-0 table overlaps only the base level's last table, the one that holds
// them: 912 bytes per record in the same run, and 8-10k acks/s became 20k. Records keep their keys: Open moves the few other keys of a layout 1
// store (one chunk key per 1024 records, the meta and state keys) in place,
// a batch per transaction, each batch writing the new keys and deleting the
// old ones, so a crash in the middle leaves no key lost or doubled and the
// next Open finishes the move. The version key is written last.
//
// A store migrated to layout 2 must not be opened by a Peat from before the
// migration: it would not find its meta keys.
//
// Layout 3 writes a group commit's records as batches, one Badger entry per
// run of records of one chunk, keyed by the run's last offset (doc.go,
// "Record value"). Nothing moves: a layout 2 record is a batch of one whose
// last offset is its own, so Open of a layout 2 store only writes the new
// version. A Peat of layout 2 must not open a layout 3 store (it would read
// a batch as one corrupt record at its last offset), which the version
// forbids.
//
// Layout 4 adds each stream's own consumer state ('v', stream_state.go);
// nothing moves in logstore. mqtt moves its group offsets and session
// cursors there from the node-wide state, so a Peat of layout 3 must not
// open a layout 4 store: it would not find them.
const layoutVersion = 4

// layout1Moves maps layout 1's tags to layout 2's.
var layout1Moves = [...]struct{ from, to byte }{
	{'c', tagChunk},
	{'k', tagState},
	{'m', tagMeta},
}

// moves is how many of layout1Moves a store of layout v needs: all for
// layout 1, none after (layout 2 to 3 moves nothing).
func moves(v uint32) int {
	if v < 2 {
		return len(layout1Moves)
	}
	return 0
}

func layoutKey() []byte { return []byte{tagMeta, metaLayout} }

// migrateLayout brings the database to layoutVersion (before the streams
// load).
func (st *Store) migrateLayout() error {
	v, err := st.readLayout()
	if err != nil {
		return fmt.Errorf("logstore: read key layout version: %w", err)
	}
	switch {
	case v == layoutVersion:
		return nil
	case v > layoutVersion:
		return fmt.Errorf("logstore: data written with key layout %d, this Peat reads layouts up to %d", v, layoutVersion)
	}
	t0 := time.Now()
	moved := 0
	for _, m := range layout1Moves[:moves(v)] {
		n, err := st.moveKeys(m.from, m.to)
		moved += n
		if err != nil {
			return fmt.Errorf("logstore: migrate key layout %d to %d: %w", v, layoutVersion, err)
		}
	}
	err = st.db.Update(func(txn *badger.Txn) error {
		return txn.Set(layoutKey(), binary.BigEndian.AppendUint32(nil, layoutVersion))
	})
	if err != nil {
		return fmt.Errorf("logstore: write key layout version: %w", err)
	}
	if moved > 0 {
		st.log.Info("moved the store's keys to the current key layout", slog.Int("layout", layoutVersion),
			slog.Int("keys", moved), slog.Duration(attrTook, time.Since(t0)))
	}
	return nil
}

// readLayout returns the stored layout version; 1 when none is stored (a
// layout 1 store, or a new one).
func (st *Store) readLayout() (uint32, error) {
	v := uint32(1)
	err := st.view(func(txn *badger.Txn) error {
		item, err := txn.Get(layoutKey())
		if err == badger.ErrKeyNotFound {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(b []byte) error {
			if len(b) != 4 {
				return fmt.Errorf("%d bytes, want 4", len(b))
			}
			v = binary.BigEndian.Uint32(b)
			return nil
		})
	})
	return v, err
}

// moveKeys gives every key that starts with from the first byte to instead,
// keeping its value, and returns how many it moved.
func (st *Store) moveKeys(from, to byte) (int, error) {
	type entry struct{ key, val []byte }
	moved := 0
	seek := []byte{from}
	for {
		var batch []entry
		size := 0
		err := st.view(func(txn *badger.Txn) error {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{from}})
			defer it.Close()
			for it.Seek(seek); it.Valid(); it.Next() {
				item := it.Item()
				sz := 2*len(item.Key()) + int(item.ValueSize()) + 64
				if len(batch) > 0 && (2*len(batch)+2 >= st.txnCount || size+sz > st.txnBytes) {
					break
				}
				val, err := item.ValueCopy(nil)
				if err != nil {
					return fmt.Errorf("read %q: %w", item.Key(), err)
				}
				batch = append(batch, entry{item.KeyCopy(nil), val})
				size += sz
			}
			return nil
		})
		if err != nil || len(batch) == 0 {
			return moved, err
		}
		err = st.db.Update(func(txn *badger.Txn) error {
			for _, e := range batch {
				if err := txn.Set(append([]byte{to}, e.key[1:]...), e.val); err != nil {
					return err
				}
				if err := txn.Delete(e.key); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return moved, err
		}
		moved += len(batch)
		seek = append(batch[len(batch)-1].key, 0)
	}
}
