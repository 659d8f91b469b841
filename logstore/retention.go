package logstore

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

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
	gone, moved := s.epochs.startAt(newStart)
	err := s.update(func(txn *badger.Txn) error {
		if err := txn.Set(startKey(s.id), binary.BigEndian.AppendUint64(nil, newStart)); err != nil {
			return err
		}
		if err := deleteEpochs(txn, s.id, gone); err != nil {
			return err
		}
		if err := setEpochs(txn, s.id, moved); err != nil {
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
	s.epochs.trimStart(len(gone), moved)
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

// update runs fn in a write transaction, held off while DropPrefix runs.
func (s *Stream) update(fn func(txn *badger.Txn) error) error {
	s.st.writeMu.RLock()
	defer s.st.writeMu.RUnlock()
	return s.st.db.Update(fn)
}
