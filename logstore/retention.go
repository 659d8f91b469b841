package logstore

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// load reads the stream's log start, log end and chunk stats. The log end is
// the last record key + 1, or the persisted start when no record is left.
// The stats of the first and last chunk are recomputed from the records, so
// a crash in the middle of a truncation or a fully emptied log leaves no
// stale figures.
func (s *Stream) load() error {
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
	if reclaimFrom == ^uint64(0) {
		reclaimFrom = start >> blockShift
	}
	s.first.Store(start)
	s.next.Store(next)
	if s.st.cfg.ManualCommit {
		s.committed.Store(start)
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

// scanChunk reads the records of [from, to) (inside chunk cs), batch by
// batch, and counts each as the appender did (recordBytes). drop, when not
// nil, is asked in offset order whether each record goes; it stops being
// asked at the first "no". scanChunk returns the stats of the records kept
// and the first offset kept (to when all went). A record that cannot be
// decoded counts as old as the oldest kept; a batch whose framing is bad
// counts its whole entry on the first offset it may hold.
func (s *Stream) scanChunk(cs, from, to uint64, drop func(off uint64, ts, size int64) bool) (chunk, uint64, error) {
	kept := chunk{start: cs}
	firstKept := to
	dropping := drop != nil
	visit := func(off uint64, ts, size int64) {
		if dropping && drop(off, ts, size) {
			return
		}
		dropping = false
		if firstKept == to {
			firstKept = off
		}
		kept.add(ts, size)
	}
	var vals [][]byte
	expect := from // where the next batch starts, for one whose framing is bad
	err := s.st.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagRecord, s.id)})
		defer it.Close()
		for it.Seek(recordKey(s.id, from)); it.Valid() && expect < to; it.Next() {
			item := it.Item()
			last := keyOffset(item.Key())
			whole := int64(len(item.Key())) + item.ValueSize()
			err := item.Value(func(v []byte) error {
				first, vs, err := parseBatch(last, v, vals)
				vals = vs
				if err != nil {
					return err
				}
				for i := max(from, first) - first; i < uint64(len(vs)) && first+i < to; i++ {
					off := first + i
					ts := kept.minTs // unknown: treat as old as the oldest kept
					if r, err := decodeRecord(off, vs[i]); err == nil {
						ts = r.Timestamp
					}
					visit(off, ts, recordBytes(len(vs[i])))
				}
				return nil
			})
			if err != nil {
				for off := expect; off <= last && off < to; off++ {
					visit(off, kept.minTs, whole)
					whole = 0
				}
			}
			expect = last + 1
		}
		return nil
	})
	return kept, firstKept, err
}

// retain applies the stream's retention at now (appender goroutine). Only
// committed records are dropped. The new log start and the stats of a
// partly dropped chunk are persisted in one transaction; the keys stay
// until a later reclaim drops whole blocks.
func (s *Stream) retain(now time.Time) (uint64, error) {
	start, hw := s.first.Load(), s.committed.Load()
	if hw <= start || (s.cfg.MaxAge == 0 && s.cfg.MaxBytes == 0) {
		return 0, s.maybeReclaim(now)
	}
	cutoff := now.Add(-s.cfg.MaxAge).UnixMilli()
	bytes := s.bytes.Load()
	chunks := s.mu.chunks
	newStart, i := start, 0
	var partial *chunk
	for ; i < len(chunks); i++ {
		c := chunks[i]
		end := min(c.start+chunkSize, hw)
		if end <= newStart {
			continue
		}
		excess := int64(0)
		if s.cfg.MaxBytes > 0 {
			excess = bytes - s.cfg.MaxBytes
		}
		oldAll := s.cfg.MaxAge > 0 && c.maxTs < cutoff
		if c.start+chunkSize <= hw && (oldAll || (excess > 0 && c.bytes <= excess)) {
			bytes -= c.bytes
			newStart = c.start + chunkSize
			continue
		}
		oldSome := s.cfg.MaxAge > 0 && c.minTs < cutoff
		if !oldSome && excess <= 0 {
			break
		}
		var gone int64
		kept, firstKept, err := s.scanChunk(c.start, max(c.start, newStart), min(c.start+chunkSize, s.next.Load()),
			func(off uint64, ts, size int64) bool {
				if off >= hw {
					return false // never drop what readers cannot see yet
				}
				if (s.cfg.MaxAge > 0 && ts < cutoff) || gone < excess {
					gone += size
					return true
				}
				return false
			})
		if err != nil {
			return 0, fmt.Errorf("scan chunk %d: %w", c.start, err)
		}
		if firstKept > newStart {
			newStart = firstKept
			bytes -= c.bytes - kept.bytes
			partial = &kept
		}
		break
	}
	if newStart == start {
		return 0, s.maybeReclaim(now)
	}
	err := s.update(func(txn *badger.Txn) error {
		if err := txn.Set(startKey(s.id), binary.BigEndian.AppendUint64(nil, newStart)); err != nil {
			return err
		}
		if partial != nil {
			return txn.Set(chunkKey(s.id, partial.start), partial.encode())
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("persist log start %d: %w", newStart, err)
	}
	s.mu.Lock()
	s.mu.chunks = s.mu.chunks[i:]
	if partial != nil && len(s.mu.chunks) > 0 && s.mu.chunks[0].start == partial.start {
		if partial.count == 0 {
			s.mu.chunks = s.mu.chunks[1:]
		} else {
			s.mu.chunks[0] = *partial
		}
	}
	s.mu.Unlock()
	s.first.Store(newStart)
	s.reclaim.hidden += s.bytes.Load() - bytes
	s.bytes.Store(bytes)
	dropped := newStart - start
	s.mDropped.Add(float64(dropped))
	return dropped, s.maybeReclaim(now)
}

// retainSlack is how far past max_bytes a stream may grow before a commit
// applies retention at once (retainOnCommit). Retention scans up to a chunk
// of records each time it runs; a sixteenth of max_bytes makes that a
// small share of what was appended meanwhile.
func (sc StreamConfig) retainSlack() int64 { return sc.MaxBytes / 16 }

// retainOnCommit applies retention right after a commit (appender
// goroutine) when the stream has grown past max_bytes by more than
// retainSlack. Waiting for the retention loop let a stream grow by a whole
// RetentionInterval of ingest (30 s by default) before anything was
// dropped, and so before any disk came back.
func (s *Stream) retainOnCommit(now time.Time) {
	if s.cfg.MaxBytes <= 0 || s.bytes.Load() <= s.cfg.MaxBytes+s.cfg.retainSlack() ||
		s.committed.Load() <= s.first.Load() { // with ManualCommit: nothing readers saw yet goes
		return
	}
	if _, err := s.retain(now); err != nil {
		s.st.log.Warn("retention failed", slog.String(attrStream, s.name), slog.Any(attrErr, err))
	}
}

// retainForSpace runs when the store refuses a commit of the stream for
// lack of space (appender goroutine): retention, and a reclaim of what it
// dropped that does not wait for its turn (maybeReclaim), so the disk it
// gives back ends the refusal. Appends refused meanwhile fail at once, so
// it runs at most once per reclaimMinGap.
func (s *Stream) retainForSpace(now time.Time) {
	if now.Sub(s.reclaim.lastForSpace) < reclaimMinGap {
		return
	}
	s.reclaim.lastForSpace = now
	if _, err := s.retain(now); err != nil {
		s.st.log.Warn("retention for space failed", slog.String(attrStream, s.name), slog.Any(attrErr, err))
	}
}

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
	lasts, cut, err := s.truncation(offset)
	if err != nil {
		return err
	}
	for {
		hw := s.committed.Load()
		if hw <= offset || s.committed.CompareAndSwap(hw, offset) {
			break
		}
	}
	s.tail.truncate(offset)
	s.notify()
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
	s.next.Store(offset)
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
	s.notify()
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

// update runs fn in a write transaction, held off while DropPrefix runs.
func (s *Stream) update(fn func(txn *badger.Txn) error) error {
	s.st.writeMu.RLock()
	defer s.st.writeMu.RUnlock()
	return s.st.db.Update(fn)
}
