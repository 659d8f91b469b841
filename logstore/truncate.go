package logstore

import (
	"fmt"

	badger "github.com/dgraph-io/badger/v4"
)

// truncate drops every record >= offset (appender goroutine). Readers stop
// at the lowered watermark first; batches are deleted from the top down so
// a crash leaves a contiguous log that load() reads correctly. The batch
// that holds offset-1 and offset is cut: what it holds below offset is
// written back as a batch keyed by offset-1, in the same transaction that
// deletes it.
func (s *Stream) truncate(offset uint64) error {
	next, start := s.next.Load(), s.first.Load()
	if offset >= next {
		return nil
	}
	if offset < start {
		return fmt.Errorf("offset below log start %d: %w", start, ErrOffsetOutOfRange)
	}
	// hwMu from the check to the lowered watermark: SetHighWatermark must
	// not raise it over the cut meanwhile.
	s.hwMu.Lock()
	if hw := s.committed.Load(); s.st.cfg.ManualCommit && offset < hw {
		s.hwMu.Unlock()
		return fmt.Errorf("offset below the high watermark %d: %w", hw, ErrBelowHighWatermark)
	}
	lasts, cut, err := s.truncation(offset)
	if err != nil {
		s.hwMu.Unlock()
		return err
	}
	s.committed.Store(min(s.committed.Load(), offset))
	s.hwMu.Unlock()
	s.tail.truncate(offset)
	// The log end goes down before the batches: ReadRaw, bounded by it,
	// must not meet a deleted one and call it missing. With the epochs
	// trimmed under the same lock, EndOffsetForEpoch never pairs a
	// truncated epoch with the new end. Their keys go with the chunk
	// stats below; Open drops any a crash leaves.
	epochs := s.epochs.truncateAt(offset, func() { s.next.Store(offset) })
	s.shipResetTo(offset)
	s.notify(movedHW | movedEnd)
	batch := max(s.st.txnCount/2, 1)
	for hi := len(lasts); hi > 0; {
		lo := max(0, hi-batch)
		err := s.update(func(txn *badger.Txn) error {
			for i := hi; i > lo; i-- {
				if err := txn.Delete(recordKey(s.id, lasts[i-1])); err != nil {
					return err
				}
			}
			if lo == 0 && cut != nil {
				return txn.Set(recordKey(s.id, offset-1), cut)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("delete batches ending in [%d, %d]: %w", lasts[lo], lasts[hi-1], err)
		}
		hi = lo
	}
	cs := offset &^ (chunkSize - 1)
	kept, _, err := s.scanChunk(cs, max(cs, start), offset, nil)
	if err != nil {
		return fmt.Errorf("rescan chunk %d: %w", cs, err)
	}
	err = s.update(func(txn *badger.Txn) error {
		for c := cs + chunkSize; c < next; c += chunkSize {
			if err := txn.Delete(chunkKey(s.id, c)); err != nil {
				return err
			}
		}
		if err := deleteEpochs(txn, s.id, epochs); err != nil {
			return err
		}
		if kept.count == 0 {
			return txn.Delete(chunkKey(s.id, cs))
		}
		return txn.Set(chunkKey(s.id, cs), kept.encode())
	})
	if err != nil {
		return fmt.Errorf("rewrite chunk stats: %w", err)
	}
	s.mu.Lock()
	cl := s.mu.chunks
	for len(cl) > 0 && cl[len(cl)-1].start >= cs {
		cl = cl[:len(cl)-1]
	}
	if kept.count > 0 {
		cl = append(cl, kept)
	}
	s.mu.chunks = cl
	var total int64
	for _, c := range cl {
		total += c.bytes
	}
	s.mu.Unlock()
	s.bytes.Store(total)
	s.notify(movedHW | movedEnd)
	return nil
}

// truncation returns the last offsets of the batches that hold offsets at
// or above offset, in order, and, when the first of them starts below
// offset, the value of its part below offset (nil otherwise).
func (s *Stream) truncation(offset uint64) (lasts []uint64, cut []byte, err error) {
	err = s.st.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagRecord, s.id)})
		defer it.Close()
		for it.Seek(recordKey(s.id, offset)); it.Valid(); it.Next() {
			last := keyOffset(it.Item().Key())
			lasts = append(lasts, last)
			if len(lasts) > 1 || offset&(chunkSize-1) == 0 {
				continue // batches never cross a chunk: offset starts one
			}
			if _, err := txn.Get(recordKey(s.id, offset-1)); err == nil {
				continue // the batch below ends at offset-1
			}
			err := it.Item().Value(func(v []byte) error {
				first, vals, err := parseBatch(last, v, nil)
				if err != nil {
					return &CorruptError{Stream: s.name, Offset: offset, Err: err}
				}
				if first < offset {
					cut = appendBatch(nil, vals[:offset-first])
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("cut the batch ending at %d: %w", last, err)
			}
		}
		return nil
	})
	return lasts, cut, err
}
