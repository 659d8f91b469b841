package logstore

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// vlogBytes is the space the value-log files take on disk.
func vlogBytes(tb testing.TB, dir string) int64 {
	tb.Helper()
	return filesSize(tb, dir, ".vlog")
}

// fragment returns a level >= 1 table of stream s whose keys all lie in one
// 65536-offset block.
func fragment(s *Stream) (badger.TableInfo, bool) {
	for _, ti := range s.st.db.Tables() {
		if ti.Level > 0 && len(ti.Left) >= recordKeyLen && len(ti.Right) >= recordKeyLen &&
			bytes.HasPrefix(ti.Left, prefix(tagRecord, s.id)) && bytes.Equal(ti.Left[:blockKeyLen], ti.Right[:blockKeyLen]) {
			return ti, true
		}
	}
	return badger.TableInfo{}, false
}

// A DropPrefix that cuts a table in two can leave less than a block of it in
// a table of its own, which the next DropPrefix would delete unread, never
// counting its values as garbage: value-log GC would never give their files
// back. A reclaim must not make such a table, and must read one that is
// there.
func TestReclaim_GivesBackTheValueLogOfACutTable(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxAge: time.Hour, Durability: DurabilityInterval})
	cfg.ReclaimInterval = time.Nanosecond
	cfg.tune = func(p *profileSpec) { p.valueThreshold, p.valueLogFileSize, p.baseTableSize = 64, 1*mib, 4*mib }
	// One entry per record, as key layout 2 wrote them (and old stores still
	// hold them): batches of about 200 records would leave 400k records a
	// single table of 2,000 keys, nothing to cut. The plan is the same for
	// tables of batch pointers, which only take ~200 times more records.
	cfg.batchValue = 1
	st, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := st.Stream("s")
	const n = 400_000
	t0 := time.Now().Add(-48 * time.Hour).UnixMilli()
	payload := make([]byte, 128)
	for i := 0; i < n; i += 2000 {
		recs := make([]*Record, 2000)
		for j := range recs {
			recs[j] = &Record{Topic: "sensors/x", Payload: payload, QoS: 1, Timestamp: t0 + int64(i+j)}
		}
		if _, err := s.Append(context.Background(), recs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil { // flushes the memtables
		t.Fatal(err)
	}
	st = openStore(t, cfg)
	s = st.Stream("s")
	if err := st.db.Flatten(1); err != nil {
		t.Fatal(err)
	}
	perRecord := vlogBytes(t, cfg.Dir) / n

	// Drop up to the block boundary inside the table with the most records
	// past it: what is left of that table is less than a block.
	var cut uint64
	for _, ti := range st.db.Tables() {
		if ti.Level == 0 || !bytes.HasPrefix(ti.Left, prefix(tagRecord, s.id)) || !bytes.HasPrefix(ti.Right, prefix(tagRecord, s.id)) {
			continue
		}
		lo, hi := keyOffset(ti.Left[:recordKeyLen]), keyOffset(ti.Right[:recordKeyLen])
		if b := hi &^ (blockSize - 1); b > lo && hi-b > 10_000 && hi < n-blockSize && b > cut {
			cut = b
		}
	}
	if cut == 0 {
		t.Fatalf("no table to cut: %+v", st.db.Tables())
	}
	retainUpTo := func(off uint64) {
		t.Helper()
		if _, err := s.ApplyRetention(context.Background(), time.UnixMilli(t0+int64(off)).Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if s.FirstOffset() != off {
			t.Fatalf("FirstOffset = %d, want %d", s.FirstOffset(), off)
		}
		st.valueLogGC(context.Background())
	}
	// Retention up to the cut: the reclaim stops a block short, so what is
	// left of the table spans two blocks.
	retainUpTo(cut)
	if ti, ok := fragment(s); ok {
		t.Fatalf("reclaim up to %d left a table inside one block: %+v", cut, ti)
	}
	if s.reclaimFrom != cut>>blockShift-1 {
		t.Fatalf("reclaimed below block %d, want %d", s.reclaimFrom, cut>>blockShift-1)
	}
	// Cut it anyway, as a DropPrefix of the last block would.
	st.writeMu.Lock()
	err = st.db.DropPrefix(blockPrefix(tagRecord, s.id, s.reclaimFrom), blockPrefix(tagChunk, s.id, s.reclaimFrom))
	st.writeMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	s.reclaimFrom++
	frag, ok := fragment(s)
	if !ok {
		t.Fatalf("cutting at %d left no table inside one block: %+v", cut, st.db.Tables())
	}
	t.Logf("cut at %d left a table of %d keys at level %d", cut, frag.KeyCount, frag.Level)

	// Drop past that table: its values must go with the rest.
	end := cut + 2*blockSize
	retainUpTo(end)
	kept := s.reclaimFrom << blockShift // the reclaim may stop short of end (above)
	if kept <= cut {
		t.Fatalf("reclaimed below %d, want past the block at %d", kept, cut)
	}
	live := int64(n-kept) * perRecord
	if got, limit := vlogBytes(t, cfg.Dir), live+3*mib; got > limit {
		t.Fatalf("value log holds %d bytes after retention, want at most %d (the retained records' %d and three 1 MiB files)",
			got, limit, live)
	}
	if recs, err := s.Read(end, 1, 0); err != nil || len(recs) != 1 {
		t.Fatalf("Read(%d) after reclaim = %v, %v", end, recs, err)
	}
}

// diskBytes is the space the files of dir take on disk (allocated blocks:
// Badger's files are sparse).
func diskBytes(tb testing.TB, dir string) int64 {
	tb.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			n += allocated(fi)
		}
	}
	return n
}

// Under size retention the directory stays bounded however much is
// appended: retention, DropPrefix and value-log GC (the store's own loop,
// running while appends go on) give the space back. With the pi-zero
// profile the records live in the value log, which only GC shrinks.
func TestRetention_DiskStaysBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("appends 96-192 MiB")
	}
	const maxBytes = 16 << 20
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxBytes: maxBytes, Durability: DurabilityInterval})
	cfg.RetentionInterval, cfg.ReclaimInterval = 20*time.Millisecond, time.Millisecond
	cfg.tune = func(p *profileSpec) { p.valueLogFileSize = 4 * mib } // more files to give back
	st := openStore(t, cfg)
	s := st.Stream("s")
	// What may stay: the retained records and the partly retained
	// 65536-offset block that is not reclaimed yet, half as much again for
	// Badger's overhead (value-log entry headers, table keys and indexes,
	// tables being compacted), the value-log file being written and one
	// waiting for GC, and the memtables' write-ahead logs.
	payload := make([]byte, 128)
	const recBytes = recordKeyLen + 150 // about this record, encoded
	limit := int64(3*(maxBytes+blockSize*recBytes)/2 + 2*4*mib + 2*profiles[ProfilePiZero].memTableSize)
	var peak, written int64
	total := int64(12 * maxBytes)
	if raceEnabled {
		total /= 2 // still half again the limit
	}
	for written < total {
		recs := make([]*Record, 1000)
		for i := range recs {
			recs[i] = &Record{Topic: "sensors/x", Payload: payload, QoS: 1}
		}
		if _, err := s.Append(context.Background(), recs...); err != nil {
			t.Fatal(err)
		}
		written += 1000 * recBytes
		if s.NextOffset()%20_000 == 0 {
			peak = max(peak, diskBytes(t, cfg.Dir))
		}
	}
	// Let the loop catch up, then look again.
	deadline := time.Now().Add(10 * time.Second)
	for s.Bytes() > maxBytes && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	end := diskBytes(t, cfg.Dir)
	peak = max(peak, end)
	t.Logf("appended %d MiB with max_bytes %d MiB: %d MiB on disk at most, %d MiB at the end (value log %d MiB), limit %d MiB",
		written>>20, maxBytes>>20, peak>>20, end>>20, vlogBytes(t, cfg.Dir)>>20, limit>>20)
	if peak > limit {
		t.Fatalf("%d bytes on disk under retention, want at most %d", peak, limit)
	}
	if got := readAll(t, s, s.FirstOffset()); uint64(len(got)) != s.NextOffset()-s.FirstOffset() {
		t.Fatalf("read %d records of [%d, %d)", len(got), s.FirstOffset(), s.NextOffset())
	}
}
