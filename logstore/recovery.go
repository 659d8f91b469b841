package logstore

import (
	"encoding/binary"
	"fmt"

	badger "github.com/dgraph-io/badger/v4"
)

// load reads the stream's log start, log end and chunk stats. The log end is
// the last record key + 1, or the persisted start when no record is left.
// The stats of the first and last chunk are recomputed from the records, so
// a crash in the middle of a truncation or a fully emptied log leaves no
// stale figures.
func (s *Stream) load() error {
	if err := s.loadIncarnation(); err != nil {
		return err
	}
	var start, next uint64
	var chunks []chunk
	reclaimFrom, firstKey := ^uint64(0), ^uint64(0)
	err := s.st.view(func(txn *badger.Txn) error {
		item, err := txn.Get(startKey(s.id))
		switch {
		case err == badger.ErrKeyNotFound:
		case err != nil:
			return fmt.Errorf("read log start: %w", err)
		default:
			if err := item.Value(func(v []byte) error {
				if len(v) != 8 {
					return fmt.Errorf("log start: %d bytes, want 8", len(v))
				}
				start = binary.BigEndian.Uint64(v)
				return nil
			}); err != nil {
				return err
			}
		}
		next = start
		rp := prefix(tagRecord, s.id)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: rp, Reverse: true})
		it.Seek(append(append([]byte(nil), rp...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
		if it.Valid() {
			next = max(next, keyOffset(it.Item().Key())+1)
		}
		it.Close()
		it = txn.NewIterator(badger.IteratorOptions{Prefix: rp})
		if it.Rewind(); it.Valid() {
			firstKey = keyOffset(it.Item().Key())
			reclaimFrom = firstKey >> blockShift
		}
		it.Close()

		it = txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagChunk, s.id), PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			cs := keyOffset(it.Item().Key())
			reclaimFrom = min(reclaimFrom, cs>>blockShift)
			if cs+chunkSize <= start || cs >= next {
				continue // dropped by retention or truncation, not reclaimed yet
			}
			var c chunk
			if err := it.Item().Value(func(v []byte) (err error) {
				c, err = decodeChunk(cs, v)
				return err
			}); err != nil {
				return err
			}
			chunks = append(chunks, c)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if next == start {
		chunks = nil // no record left: a chunk holding the start is of records below it (ResetTo)
	}
	if reclaimFrom == ^uint64(0) {
		reclaimFrom = start >> blockShift
	}
	if err := s.loadEpochs(next); err != nil {
		return err
	}
	s.first.Store(start)
	s.next.Store(next)
	if s.st.cfg.ManualCommit {
		hw, err := s.loadHW(start, next)
		if err != nil {
			return err
		}
		s.committed.Store(hw)
		s.hwPersisted = hw
	} else {
		s.committed.Store(next)
	}
	s.reclaimFrom = reclaimFrom
	if firstKey < start {
		// Records below the log start are still stored: how many bytes is
		// not known, but a reclaim for space must not think it has nothing
		// to give back.
		s.reclaim.hidden = 1
	}
	s.mu.chunks = chunks
	if next > start {
		if err := s.rescanChunk(start &^ (chunkSize - 1)); err != nil {
			return err
		}
		if err := s.rescanChunk((next - 1) &^ (chunkSize - 1)); err != nil {
			return err
		}
	}
	var total int64
	for _, c := range s.mu.chunks {
		total += c.bytes
	}
	s.bytes.Store(total)
	return nil
}

// rescanChunk recomputes the in-memory stats of chunk cs from its records
// in [max(cs, start), min(cs+1024, next)).
func (s *Stream) rescanChunk(cs uint64) error {
	c, _, err := s.scanChunk(cs, max(cs, s.first.Load()), min(cs+chunkSize, s.next.Load()), nil)
	if err != nil {
		return err
	}
	s.setChunk(c)
	return nil
}

// setChunk replaces (or inserts, or with count 0 removes) chunk c.start in
// memory.
func (s *Stream) setChunk(c chunk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := s.mu.chunks
	i := 0
	for i < len(cs) && cs[i].start < c.start {
		i++
	}
	switch {
	case i < len(cs) && cs[i].start == c.start && c.count == 0:
		s.mu.chunks = append(cs[:i:i], cs[i+1:]...)
	case i < len(cs) && cs[i].start == c.start:
		cs[i] = c
	case c.count > 0:
		s.mu.chunks = append(cs[:i:i], append([]chunk{c}, cs[i:]...)...)
	}
}
