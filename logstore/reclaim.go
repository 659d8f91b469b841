package logstore

import (
	"bytes"
	"fmt"
	"log/slog"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// maybeReclaim gives back the space of whole 65536-offset blocks below the
// log start with one DropPrefix call, at most once per ReclaimInterval for
// the whole store. DropPrefix stops every writer while it runs, so the
// store's commits wait on writeMu instead of failing.
func (s *Stream) maybeReclaim(now time.Time) error {
	upto := s.first.Load() >> blockShift // blocks below upto are whole and hidden
	if upto <= s.reclaimFrom || !s.st.reclaimDue(now) {
		return nil
	}
	const maxBlocks = 2048
	upto = min(upto, s.reclaimFrom+maxBlocks)
	prefixes, upto, split := s.reclaimPrefixes(s.reclaimFrom, upto)
	s.st.writeMu.Lock()
	t0 := time.Now()
	err := s.st.db.DropPrefix(prefixes...)
	s.st.writeMu.Unlock()
	if err != nil {
		return fmt.Errorf("reclaim blocks [%d, %d): %w", s.reclaimFrom, upto, err)
	}
	s.st.metrics.Reclaims.Inc()
	s.st.reclaimed.Store(true)
	s.st.log.Debug("reclaimed retained-out records", slog.String(attrStream, s.name),
		slog.Uint64("below_offset", upto<<blockShift), slog.Int("split_blocks", split),
		slog.Duration(attrTook, time.Since(t0)))
	s.reclaimFrom = upto
	return nil
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
func (s *Stream) soleBlock(ti badger.TableInfo) (uint64, bool) {
	l, r := ti.Left, ti.Right
	if len(l) < recordKeyLen || len(r) < recordKeyLen || !bytes.HasPrefix(l, prefix(tagRecord, s.id)) ||
		!bytes.Equal(l[:blockKeyLen], r[:blockKeyLen]) {
		return 0, false
	}
	return keyOffset(l[:recordKeyLen]) >> blockShift, true
}

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
