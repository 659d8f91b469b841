package logstore

import (
	"bytes"
	"fmt"
	"log/slog"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// maybeReclaim gives back the space of what retention dropped, with one
// DropPrefix call. DropPrefix stops every writer while it runs, so the
// store's commits wait on writeMu instead of failing, and reclaims are
// spaced out. A reclaim is due when
//
//   - a whole 65536-offset block lies below the log start, at most once
//     per ReclaimInterval for the whole store (records of a few hundred
//     bytes fill a block long before they fill the disk);
//   - or the bytes dropped and not yet given back reach reclaimThreshold
//     (a quarter of max_bytes), at most once per reclaimMinGap per stream:
//     large records fill the disk before they fill a block (16 KiB
//     records: a block is 1 GiB), and a reclaim by blocks alone never came;
//   - or the store refuses appends for lack of space and something is
//     left to give back, at most once per reclaimMinGap per stream.
//
// While appends are refused, no reclaim runs unless the disk has room for
// its own writes (refusingWithRoom).
//
// The last two give back the partly dropped block too (reclaimPartial).
// Each reclaim is followed by value-log GC, which turns what DropPrefix
// counted as garbage into free disk; waiting for the retention loop would
// let the value log grow by a RetentionInterval of ingest.
func (s *Stream) maybeReclaim(now time.Time) error {
	refusing := s.st.space.full.Load()
	if refusing && !s.st.space.refusingWithRoom() {
		return nil // no room for the reclaim's own writes: wait for space
	}
	start := s.first.Load()
	upto := start >> blockShift // blocks below upto are whole and hidden
	rs := &s.reclaim
	partialDue := rs.hidden > 0 && now.Sub(rs.last) >= reclaimMinGap &&
		(rs.hidden >= s.reclaimThreshold() || refusing)
	if !partialDue && (upto <= s.reclaimFrom || !s.st.reclaimDue(now)) {
		return nil
	}
	const maxBlocks = 2048
	upto = min(upto, s.reclaimFrom+maxBlocks)
	var prefixes [][]byte
	split := 0
	if upto > s.reclaimFrom {
		prefixes, upto, split = s.reclaimPrefixes(s.reclaimFrom, upto)
	}
	partTo := uint64(0) // offsets below it in block upto are given back
	if partialDue && upto == start>>blockShift {
		var err error
		var part [][]byte
		if part, partTo, err = s.reclaimPartial(max(upto<<blockShift, rs.upTo), start); err != nil {
			return fmt.Errorf("plan the reclaim below %d: %w", start, err)
		}
		prefixes = append(prefixes, part...)
	}
	rs.last = now
	if len(prefixes) == 0 {
		rs.hidden = 0 // nothing left to give back: the rest is in the batch holding the log start
		return nil
	}
	s.st.writeMu.Lock()
	t0 := time.Now()
	err := s.st.db.DropPrefix(prefixes...)
	s.st.writeMu.Unlock()
	if err != nil {
		return fmt.Errorf("reclaim below offset %d: %w", max(upto<<blockShift, partTo), err)
	}
	s.st.metrics.Reclaims.Inc()
	s.st.reclaimed.Store(true)
	s.st.log.Debug("reclaimed retained-out records", slog.String(attrStream, s.name),
		slog.Uint64("below_offset", max(upto<<blockShift, partTo)), slog.Int("split_blocks", split),
		slog.Int("prefixes", len(prefixes)), slog.Duration(attrTook, time.Since(t0)))
	if upto > s.reclaimFrom {
		s.reclaimFrom = upto
		rs.upTo = upto << blockShift
	}
	if partTo > 0 {
		rs.upTo = partTo
		rs.hidden = 0
	}
	s.st.valueLogGC(s.st.ctx)
	return nil
}

// backlog is the appender's account of what retention dropped and
// no reclaim has given back yet.
type backlog struct {
	hidden int64     // bytes dropped by retention since the last reclaim that reached the log start
	upTo   uint64    // record keys below it, in block reclaimFrom, are given back
	last   time.Time // the last reclaim by bytes or for space

	lastForSpace time.Time // the last retainForSpace
}

// reclaimMinGap spaces out the reclaims of one stream that are due by
// bytes or for lack of space: each stops every writer of the store for the
// length of a DropPrefix (a memtable flush and a compaction of the tables
// holding the prefixes) and a value-log GC.
const reclaimMinGap = 250 * time.Millisecond

// reclaimThreshold is how many dropped bytes make a reclaim due: a quarter
// of max_bytes, so what is dropped but still on disk stays below that
// (DiskBound); for a stream retained by age only, a value-log file's worth.
func (s *Stream) reclaimThreshold() int64 {
	if s.cfg.MaxBytes > 0 {
		return max(s.cfg.MaxBytes/4, minReclaimBytes)
	}
	return max(int64(s.st.maxValue), minReclaimBytes) // about a value-log file (MaxRecordBytes)
}

// minReclaimBytes keeps a tiny max_bytes from making every commit a
// reclaim.
const minReclaimBytes = 256 * kib

// reclaimPartial returns the DropPrefix prefixes that give back the record
// keys of the batches that end in [from, start), all of one block, and the
// first offset not given back. A run of 256 offsets (a prefix of 12 bytes)
// wholly below start goes as one prefix, the batches of the run that holds
// start each as their own key.
//
// As in reclaimPrefixes, no table of value pointers may lie wholly inside
// one prefix, or DropPrefix would delete it unread and value-log GC never
// learn that its values are garbage: a run holding such a table goes key
// by key, and a table of a single key keeps that key (it is hidden below
// the log start, and goes with its block).
func (s *Stream) reclaimPartial(from, start uint64) (prefixes [][]byte, to uint64, err error) {
	if from >= start {
		return nil, from, nil
	}
	soleRun := map[uint64]bool{} // runs (offset >> 8) holding a whole table
	soleKey := map[uint64]bool{} // last offsets of batches that are a table alone
	rp := prefix(tagRecord, s.id)
	for _, ti := range s.st.db.Tables() {
		l, r := ti.Left, ti.Right
		if ti.Level == 0 || len(l) < recordKeyLen || len(r) < recordKeyLen || !bytes.HasPrefix(l, rp) || !bytes.HasPrefix(r, rp) {
			continue
		}
		lo, hi := keyOffset(l[:recordKeyLen]), keyOffset(r[:recordKeyLen])
		switch {
		case lo == hi:
			soleKey[lo] = true
		case lo>>runShift == hi>>runShift:
			soleRun[lo>>runShift] = true
		}
	}
	var lasts []uint64 // batches ending in [from, start), in order
	err = s.st.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: rp})
		defer it.Close()
		for it.Seek(recordKey(s.id, from)); it.Valid(); it.Next() {
			last := keyOffset(it.Item().Key())
			if last >= start {
				break
			}
			lasts = append(lasts, last)
		}
		return nil
	})
	if err != nil {
		return nil, from, err
	}
	prefixes, to = partialPrefixes(s.id, lasts, start, soleRun, soleKey)
	return prefixes, max(to, from), nil
}

// partialPrefixes plans reclaimPartial's prefixes for the batches ending
// at lasts (ascending, all below start), given the runs that hold a table
// of their own and the batches that are one; to is past the last batch.
func partialPrefixes(id uint32, lasts []uint64, start uint64, soleRun, soleKey map[uint64]bool) (prefixes [][]byte, to uint64) {
	for i := 0; i < len(lasts); {
		run := lasts[i] >> runShift
		j := i
		for j < len(lasts) && lasts[j]>>runShift == run {
			j++
		}
		if whole := (run+1)<<runShift <= start; whole && !soleRun[run] {
			prefixes = append(prefixes, runPrefix(id, run))
		} else {
			for _, last := range lasts[i:j] {
				if !soleKey[last] {
					prefixes = append(prefixes, recordKey(id, last))
				}
			}
		}
		to = lasts[j-1] + 1
		i = j
	}
	return prefixes, to
}

// runShift: a run is 256 offsets, the keys sharing a 12-byte prefix.
const runShift = 8

// runPrefix is the prefix of the record keys of run (offset >> 8).
func runPrefix(id uint32, run uint64) []byte {
	return recordKey(id, run<<runShift)[:recordKeyLen-1]
}

// subBlocks is how many prefixes of one more byte cover a block.
const subBlocks = 256

// pointerEntryMax is the largest size per key (uncompressed blocks) of a
// table whose entries point into the value log: key, version, 12-byte value
// pointer and block overhead come to about 32 bytes (measured); tables of
// inline records take several times more. (TableInfo.OnDiskSize is no
// measure: tables rewritten by DropPrefix report several times their data.)
const pointerEntryMax = 96

// reclaimPrefixes returns the DropPrefix prefixes that give back blocks
// [from, upto'), where upto' is upto or a little less, and how many blocks
// had their record prefix split.
//
// DropPrefix deletes a table whose keys all share one of the prefixes
// without reading it (badger levels.go:938, keepTable), so the value-log
// entries its keys point to are never counted as discarded; value-log GC
// picks the file to rewrite by those counts alone (value.go:1027) and
// rewrites one only when at least half of it is counted. Each uncounted
// table leaves its value-log file looking fuller than it is, and a file
// that never reaches half is never given back: with records in the value
// log, the disk would fill up under retention (TestReclaim_GivesBackThe-
// ValueLogOfACutTable). Such a table appears where a DropPrefix cut a table
// and kept less than a block of it. So:
//
//   - upto is lowered (by at most two blocks) so as not to cut a table that
//     would keep less than a block: what it keeps then spans two blocks;
//   - a block that still holds a table of its own (another cut, or a
//     compaction) has its record prefix replaced by its 256 prefixes of 256
//     offsets each, so DropPrefix reads that table and counts what it
//     drops. This costs DropPrefix time (it compares each key it reads with
//     every prefix), which is why it is the fallback.
//
// Only tables of value pointers matter: tables of inline records point at
// nothing, and splitting every block they fit in would make DropPrefix
// compare each key with thousands of prefixes. Level 0 tables are always
// read.
func (s *Stream) reclaimPrefixes(from, upto uint64) (prefixes [][]byte, end uint64, split int) {
	var tables []badger.TableInfo
	for _, ti := range s.st.db.Tables() {
		if ti.Level > 0 && ti.KeyCount > 0 && uint64(ti.UncompressedSize)/uint64(ti.KeyCount) <= pointerEntryMax {
			tables = append(tables, ti)
		}
	}
	for range 2 {
		if upto-from < 2 || !s.cutsOff(tables, upto) {
			break
		}
		upto--
	}
	splitBlock := map[uint64]bool{}
	for _, ti := range tables {
		if b, ok := s.soleBlock(ti); ok && b >= from && b < upto {
			splitBlock[b] = true
		}
	}
	prefixes = make([][]byte, 0, 2*(upto-from)+subBlocks*uint64(len(splitBlock)))
	for b := from; b < upto; b++ {
		p := blockPrefix(tagRecord, s.id, b)
		if !splitBlock[b] {
			prefixes = append(prefixes, p)
		} else {
			for i := range subBlocks {
				prefixes = append(prefixes, append(p[:len(p):len(p)], byte(i)))
			}
		}
		prefixes = append(prefixes, blockPrefix(tagChunk, s.id, b))
	}
	return prefixes, upto, len(splitBlock)
}

// soleBlock returns the block of stream s that holds every key of table ti,
// if there is one.
func (s *Stream) soleBlock(ti badger.TableInfo) (uint64, bool) { return soleBlockOf(s.id, ti) }

// cutsOff reports whether dropping the blocks below upto would leave a
// table with keys below them holding keys of block upto only.
func (s *Stream) cutsOff(tables []badger.TableInfo, upto uint64) bool {
	edge := recordKey(s.id, upto<<blockShift)
	in := blockPrefix(tagRecord, s.id, upto)
	for _, ti := range tables {
		if len(ti.Left) > 8 && bytes.Compare(ti.Left[:len(ti.Left)-8], edge) < 0 && bytes.HasPrefix(ti.Right, in) {
			return true
		}
	}
	return false
}
