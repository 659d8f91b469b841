package logstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// storedBatch is one record entry of a stream as Badger holds it.
type storedBatch struct {
	first, last uint64
	size        int // value bytes
	version     byte
}

// storedBatches lists the record entries of stream s in key order.
func storedBatches(tb testing.TB, s *Stream) []storedBatch {
	tb.Helper()
	var out []storedBatch
	err := s.st.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagRecord, s.id)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			last := keyOffset(it.Item().Key())
			err := it.Item().Value(func(v []byte) error {
				first, _, err := parseBatch(last, v, nil)
				out = append(out, storedBatch{first, last, len(v), v[0]})
				return err
			})
			if err != nil {
				return fmt.Errorf("batch ending at %d: %w", last, err)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// rewriteBatch replaces the entry of the batch that holds off with what
// fn makes of its records' values (a nil element: no entry for that part).
func rewriteBatch(tb testing.TB, s *Stream, off uint64, fn func(first, last uint64, vals [][]byte) map[uint64][]byte) {
	tb.Helper()
	err := s.st.db.Update(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagRecord, s.id)})
		it.Seek(recordKey(s.id, off))
		if !it.Valid() {
			it.Close()
			return fmt.Errorf("no batch holds offset %d", off)
		}
		last := keyOffset(it.Item().Key())
		v, err := it.Item().ValueCopy(nil)
		it.Close()
		if err != nil {
			return err
		}
		first, vals, err := parseBatch(last, v, nil)
		if err != nil {
			return err
		}
		if err := txn.Delete(recordKey(s.id, last)); err != nil {
			return err
		}
		for k, nv := range fn(first, last, vals) {
			if nv != nil {
				if err := txn.Set(recordKey(s.id, k), nv); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	s.tail.truncate(0) // read from Badger, as after a restart
}

// isolate splits the batch that holds off into the records before off, off
// alone (a version-1 value under its own key, as key layout 2 stored every
// record) and the records after it, so a test can change off's entry alone.
func isolate(tb testing.TB, s *Stream, off uint64) {
	tb.Helper()
	rewriteBatch(tb, s, off, func(first, last uint64, vals [][]byte) map[uint64][]byte {
		i := off - first
		out := map[uint64][]byte{off: appendBatch(nil, vals[i:i+1])}
		if i > 0 {
			out[off-1] = appendBatch(nil, vals[:i])
		}
		if off < last {
			out[last] = appendBatch(nil, vals[i+1:])
		}
		return out
	})
}

// batchRecord is offset off's record in the batch tests: a topic and a
// payload derived from it, every 97th of 9 KiB (so the 32 KiB cap splits
// batches), the others of up to 60 bytes.
func batchRecord(off uint64) *Record {
	n := int(off*7919) % 61
	if off%97 == 0 {
		n = 9 << 10
	}
	p := bytes.Repeat([]byte{byte(off)}, n)
	return &Record{Topic: fmt.Sprintf("t/%d", off), Payload: p, QoS: 1, ClientID: "c"}
}

func checkBatchRecord(tb testing.TB, off uint64, r *Record) {
	tb.Helper()
	w := batchRecord(off)
	if r.Offset != off || r.Topic != w.Topic || !bytes.Equal(r.Payload, w.Payload) || r.ClientID != "c" {
		tb.Fatalf("offset %d read as offset %d topic %q payload of %d bytes", off, r.Offset, r.Topic, len(r.Payload))
	}
}

// appendBatchRecords appends the records [first, first+n) in concurrent
// requests of varied sizes, so group commits hold several of them.
func appendBatchRecords(tb testing.TB, s *Stream, n int) {
	tb.Helper()
	first := s.NextOffset()
	sizes := []int{1, 2, 5, 40, 300, 1500, 3}
	errs := make(chan error, n)
	reqs := 0
	for i, k := 0, 0; i < n; k++ {
		m := min(sizes[k%len(sizes)], n-i)
		recs := make([]*Record, m)
		for j := range recs {
			recs[j] = batchRecord(first + uint64(i+j))
		}
		want := first + uint64(i)
		s.AppendAsync(recs, func(got uint64, err error) {
			if err == nil && got != want {
				err = fmt.Errorf("appended at %d, want %d", got, want)
			}
			errs <- err
		})
		reqs++
		i += m
	}
	for range reqs {
		if err := <-errs; err != nil {
			tb.Fatal(err)
		}
	}
}

// checkBatches checks that the stored batches are contiguous from first to
// next, stay inside a chunk and within the cap (a batch of one may be
// larger), and returns how many hold more than one record.
func checkBatches(tb testing.TB, s *Stream, first, next uint64) int {
	tb.Helper()
	multi := 0
	want := first
	for _, b := range storedBatches(tb, s) {
		switch {
		case b.first != want:
			tb.Fatalf("batch [%d, %d] follows offset %d", b.first, b.last, want-1)
		case b.first>>chunkShift != b.last>>chunkShift:
			tb.Fatalf("batch [%d, %d] crosses a chunk boundary", b.first, b.last)
		case b.first < b.last && b.size > s.st.batchCap():
			tb.Fatalf("batch [%d, %d] takes %d bytes, over the cap %d", b.first, b.last, b.size, s.st.batchCap())
		case (b.first == b.last) != (b.version == valueVersion):
			tb.Fatalf("batch [%d, %d] has value version %d", b.first, b.last, b.version)
		}
		if b.first < b.last {
			multi++
		}
		want = b.last + 1
	}
	if want != next {
		tb.Fatalf("batches end at %d, want %d", want, next)
	}
	return multi
}

func TestBatch_ReadFromEveryOffset(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}})
	st := openStore(t, cfg)
	s := st.Stream("s")
	const n = 5000
	appendBatchRecords(t, s, n)
	bytesBefore := s.Bytes()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = openStore(t, cfg) // reads go to Badger, not to the tail cache
	s = st.Stream("s")
	if s.NextOffset() != n || s.Bytes() != bytesBefore {
		t.Fatalf("after reopen next %d bytes %d, want %d and %d", s.NextOffset(), s.Bytes(), n, bytesBefore)
	}
	multi := checkBatches(t, s, 0, n)
	if multi < n/1024 {
		t.Fatalf("%d batches of more than one record: the appender does not batch", multi)
	}
	for from := uint64(0); from < n; from++ {
		for _, max := range []int{1, 3, 700} {
			recs, err := s.Read(from, max, 0)
			if err != nil {
				t.Fatalf("Read(%d, %d): %v", from, max, err)
			}
			if want := min(max, n-int(from)); len(recs) != want {
				t.Fatalf("Read(%d, %d) = %d records, want %d", from, max, len(recs), want)
			}
			for i, r := range recs {
				checkBatchRecord(t, from+uint64(i), r)
			}
		}
	}
	// maxBytes stops inside a batch, and the next read goes on from there.
	got := 0
	for from := uint64(0); from < n; {
		recs, err := s.Read(from, 0, 5000)
		if err != nil || len(recs) == 0 {
			t.Fatalf("Read(%d, 0, 5000) = %d records, %v", from, len(recs), err)
		}
		for _, r := range recs {
			checkBatchRecord(t, from, r)
			from++
			got++
		}
	}
	if got != n {
		t.Fatalf("read %d records in pages of 5000 bytes, want %d", got, n)
	}
}

func TestBatch_NeverCrossesAChunk(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}}))
	s := st.Stream("s")
	appendN(t, s, 1000, 1000) // up to 24 short of a chunk boundary
	appendN(t, s, 3000, 3000) // one commit over three boundaries
	appendN(t, s, 2, 2)
	checkBatches(t, s, 0, 4002)
	var lasts []uint64
	for _, b := range storedBatches(t, s) {
		lasts = append(lasts, b.last)
	}
	if want := []uint64{999, 1023, 2047, 3071, 3999, 4001}; fmt.Sprint(lasts) != fmt.Sprint(want) {
		t.Fatalf("batches end at %v, want %v", lasts, want)
	}
	// A record above the cap is a batch of one; the cap splits the others.
	big := &Record{Topic: "big", Payload: make([]byte, 40<<10)}
	recs := []*Record{rec("a", "1"), big, rec("b", "2")}
	for range 5 {
		recs = append(recs, &Record{Topic: "mid", Payload: make([]byte, 12<<10)})
	}
	first, err := s.Append(context.Background(), recs...)
	if err != nil {
		t.Fatal(err)
	}
	checkBatches(t, s, 0, s.NextOffset())
	got := storedBatches(t, s)[6:]
	want := []storedBatch{{first, first, 0, 1}, {first + 1, first + 1, 0, 1}, {first + 2, first + 4, 0, 2}, {first + 5, first + 6, 0, 2}, {first + 7, first + 7, 0, 1}}
	for i := range got {
		got[i].size = 0
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}

func TestBatch_TruncateIntoABatch(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}})
	st := openStore(t, cfg)
	s := st.Stream("s")
	appendN(t, s, 3000, 3000) // batches [0, 1023] [1024, 2047] [2048, 2999]
	want := readAll(t, s, 0)

	// Each step truncates, appends, reopens and reads everything back.
	for _, c := range []struct {
		at     uint64
		append int
	}{
		{1500, 700},  // middle of a batch; the appends refill to 2200
		{2047, 1},    // the last record of a batch (a cut of [1500, 2047])
		{1024, 2000}, // the first of a batch: nothing to cut
		{1025, 10},   // a cut that leaves one record: a version-1 value
		{1, 5},       // the same in the first chunk
		{0, 3},       // everything
	} {
		if err := s.Truncate(context.Background(), c.at); err != nil {
			t.Fatalf("Truncate(%d): %v", c.at, err)
		}
		want = want[:c.at]
		if s.NextOffset() != c.at || s.Committed() != c.at {
			t.Fatalf("after Truncate(%d) next %d committed %d", c.at, s.NextOffset(), s.Committed())
		}
		checkBatches(t, s, 0, c.at)
		if c.at > 0 {
			if recs, err := s.Read(c.at-1, 10, 0); err != nil || len(recs) != 1 || recs[0].Topic != want[c.at-1].Topic {
				t.Fatalf("Read(%d) after Truncate(%d) = %v, %v", c.at-1, c.at, recs, err)
			}
		}
		bytesAfter := s.Bytes()
		recs := make([]*Record, c.append)
		for i := range recs {
			recs[i] = rec(fmt.Sprintf("after/%d/%d", c.at, i), fmt.Sprint(i))
		}
		if first, err := s.Append(context.Background(), recs...); err != nil || first != c.at {
			t.Fatalf("Append after Truncate(%d) = %d, %v", c.at, first, err)
		}
		want = append(want, recs...)
		bytesBefore := s.Bytes()
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st = openStore(t, cfg)
		s = st.Stream("s")
		if s.NextOffset() != uint64(len(want)) || s.Bytes() != bytesBefore {
			t.Fatalf("Truncate(%d), append, reopen: next %d bytes %d, want %d and %d", c.at, s.NextOffset(), s.Bytes(), len(want), bytesBefore)
		}
		checkBatches(t, s, 0, s.NextOffset())
		got := readAll(t, s, 0)
		for i, r := range got {
			if r.Offset != uint64(i) || r.Topic != want[i].Topic || string(r.Payload) != string(want[i].Payload) {
				t.Fatalf("Truncate(%d), append, reopen: offset %d read as %d %q, want %q", c.at, i, r.Offset, r.Topic, want[i].Topic)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("Truncate(%d), append, reopen: read %d records, want %d", c.at, len(got), len(want))
		}
		// The stats of the truncated chunk were recounted from the cut batch.
		if err := s.Truncate(context.Background(), c.at); err != nil || s.Bytes() != bytesAfter {
			t.Fatalf("Truncate(%d) again = %v, bytes %d, want %d", c.at, err, s.Bytes(), bytesAfter)
		}
		if _, err := s.Append(context.Background(), recs...); err != nil {
			t.Fatal(err)
		}
	}
}

// layout2Store writes, with a bare Badger, what a Peat of key layout 2
// left in dir: stream "s" (id 1) with records [0, n), one entry per record,
// and its chunk stats. The keys are spelled out byte by byte.
func layout2Store(tb testing.TB, dir string, n uint64) []*Record {
	tb.Helper()
	opts := ProfilePiZero.badgerOptions().WithDir(dir).WithValueDir(dir).WithLogger(nil)
	db, err := badger.Open(opts)
	if err != nil {
		tb.Fatal(err)
	}
	key := func(tag byte, id uint32, off uint64) []byte {
		return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32([]byte{tag}, id), off)
	}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	var recs []*Record
	chunks := map[uint64]*chunk{}
	err = db.Update(func(txn *badger.Txn) error {
		for off := range n {
			r := &Record{Offset: off, Timestamp: t0 + int64(off)*1000, Topic: fmt.Sprintf("old/%d", off),
				Payload: bytes.Repeat([]byte{'o'}, int(off%200)), QoS: 1, ClientID: "c", Epoch: 2}
			k, v := key('r', 1, off), encodeRecord(nil, r)
			if err := txn.Set(k, v); err != nil {
				return err
			}
			cs := off &^ 1023
			if chunks[cs] == nil {
				chunks[cs] = &chunk{start: cs}
			}
			chunks[cs].add(r.Timestamp, int64(len(k)+len(v)))
			recs = append(recs, r)
		}
		for cs, c := range chunks {
			if err := txn.Set(key('s', 1, cs), c.encode()); err != nil {
				return err
			}
		}
		if err := txn.Set([]byte("xns"), []byte{0, 0, 0, 1}); err != nil {
			return err
		}
		return txn.Set([]byte("xv"), []byte{0, 0, 0, 2})
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
	return recs
}

func TestLayout_OpensLayout2Store(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}})
	const n = 3000
	want := layout2Store(t, cfg.Dir, n)
	var wantBytes int64
	for _, r := range want {
		wantBytes += int64(recordKeyLen + len(encodeRecord(nil, r)))
	}
	for pass := range 2 { // the upgrade, then a plain reopen
		st := openStore(t, cfg)
		if v, err := st.readLayout(); err != nil || v != layoutVersion {
			t.Fatalf("pass %d: key layout %d, %v; want %d", pass, v, err, layoutVersion)
		}
		s := st.Stream("s")
		if s.FirstOffset() != 0 || s.NextOffset() != uint64(len(want)) || s.Bytes() != wantBytes {
			t.Fatalf("pass %d: first/next/bytes = %d/%d/%d, want 0/%d/%d", pass, s.FirstOffset(), s.NextOffset(), s.Bytes(), len(want), wantBytes)
		}
		for _, from := range []uint64{0, 1, 1023, 1024, n - 1, uint64(len(want)) - 1} {
			recs, err := s.Read(from, 2, 0)
			if err != nil || len(recs) == 0 || recs[0].Offset != from || recs[0].Topic != want[from].Topic {
				t.Fatalf("pass %d: Read(%d) = %v, %v", pass, from, recs, err)
			}
		}
		got := readAll(t, s, 0)
		if len(got) != len(want) {
			t.Fatalf("pass %d: read %d records, want %d", pass, len(got), len(want))
		}
		for i, r := range got {
			w := want[i]
			if r.Offset != uint64(i) || r.Topic != w.Topic || string(r.Payload) != string(w.Payload) || r.Timestamp != w.Timestamp || r.Epoch != w.Epoch {
				t.Fatalf("pass %d: record %d = %+v, want %+v", pass, i, r, w)
			}
		}
		if at := time.UnixMilli(want[1500].Timestamp); pass == 0 {
			if got, err := s.OffsetForTime(at); err != nil || got != 1500 {
				t.Fatalf("OffsetForTime = %d, %v; want 1500", got, err)
			}
		}
		if pass == 0 { // appends after the old records are batched
			recs := make([]*Record, 2000)
			for i := range recs {
				recs[i] = rec(fmt.Sprintf("new/%d", i), fmt.Sprint(i))
				recs[i].Timestamp = want[n-1].Timestamp + int64(i)
			}
			if first, err := s.Append(context.Background(), recs...); err != nil || first != n {
				t.Fatalf("Append after the layout 2 records = %d, %v; want %d", first, err, n)
			}
			want = append(want, recs...)
			wantBytes = s.Bytes()
			if multi := checkBatches(t, s, 0, s.NextOffset()); multi == 0 {
				t.Fatal("no batch written after the layout 2 records")
			}
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRead_CorruptRecordInsideABatch(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "telemetry", Filters: []string{"#"}}))
	s := st.Stream("telemetry")
	appendN(t, s, 100, 100) // batch [0, 99]
	appendN(t, s, 100, 100) // batch [100, 199]
	appendN(t, s, 100, 100) // batch [200, 299]
	rewriteBatch(t, s, 37, func(first, last uint64, vals [][]byte) map[uint64][]byte {
		vals[37][len(vals[37])-1] ^= 0x40 // a payload byte: the record's CRC fails
		return map[uint64][]byte{last: appendBatch(nil, vals)}
	})
	rewriteBatch(t, s, 100, func(first, last uint64, vals [][]byte) map[uint64][]byte {
		v := appendBatch(nil, vals)
		return map[uint64][]byte{last: v[:len(v)-1]} // the framing runs past the value
	})
	corruptAt := func(from, want uint64) {
		t.Helper()
		_, err := s.Read(from, 100, 0)
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Stream != "telemetry" || ce.Offset != want {
			t.Fatalf("Read(%d) = %v, want a CorruptError for telemetry at %d", from, err, want)
		}
	}
	check := func(from uint64, max, want int) {
		t.Helper()
		recs, err := s.Read(from, max, 0)
		if err != nil || len(recs) != want {
			t.Fatalf("Read(%d, %d) = %d records, %v; want %d", from, max, len(recs), err, want)
		}
		for i, r := range recs {
			if off := from + uint64(i); r.Offset != off || string(r.Payload) != fmt.Sprintf("p%d", off%100) {
				t.Fatalf("Read(%d): offset %d read as %d %q", from, off, r.Offset, r.Payload)
			}
		}
	}
	check(0, 100, 37)  // the records before the bad one
	corruptAt(37, 37)  // the bad record
	check(38, 100, 62) // the rest of its batch, up to the bad framing
	corruptAt(100, 100)
	corruptAt(150, 150) // inside a batch whose framing is bad: where the read starts
	check(200, 100, 100)
	if got := counterValue(t, st.metrics.CorruptRecords.WithLabelValues("telemetry")); got != 3 {
		t.Fatalf("peat_log_corrupt_records_total = %v, want 3", got)
	}
	// Retention's and Open's scans count the damaged batch without failing.
	if c, _, err := s.scanChunk(0, 0, 300, nil); err != nil || c.count != 300 {
		t.Fatalf("scanChunk over the damage = %d records, %v; want 300", c.count, err)
	}
	// A truncation that must cut the damaged batch refuses; one below it works.
	if err := s.Truncate(context.Background(), 150); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Truncate(150) into a batch with bad framing = %v, want ErrCorrupt", err)
	}
	if err := s.Truncate(context.Background(), 100); err != nil || s.NextOffset() != 100 {
		t.Fatalf("Truncate(100) = %v, next %d", err, s.NextOffset())
	}
	if _, err := s.Append(context.Background(), rec("a", "p0")); err != nil {
		t.Fatal(err)
	}
	check(38, 100, 63)
}

// The bytes a commit of two records stores, key and value. A change here is
// a change of the on-disk format: bump the key layout (layout.go).
func TestCodec_BatchFormatIsStable(t *testing.T) {
	st := openStore(t, testConfig(t))
	s := st.Stream("default")
	appendN(t, s, 1022, 1022)
	recs := []*Record{
		{Topic: "a", Payload: []byte("21.5"), QoS: 1, Timestamp: 1_700_000_000_000, ClientID: "dev-1"},
		{Topic: "b", Timestamp: 1_700_000_000_001},
		{Topic: "c", Timestamp: 1_700_000_000_002}, // the next chunk: a batch of its own
	}
	if _, err := s.Append(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	_ = st.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagRecord, s.id)})
		defer it.Close()
		for it.Seek(recordKey(s.id, 1022)); it.Valid(); it.Next() {
			v, _ := it.Item().ValueCopy(nil)
			got[hex.EncodeToString(it.Item().Key())] = hex.EncodeToString(v)
		}
		return nil
	})
	want := map[string]string{
		// 'r' id 1 offset 1023: version 2, 2 records, then each one's length
		// and version-1 value (CRC over its own offset, 1022 and 1023).
		"7200000001" + "00000000000003ff": "02" + "02" +
			"1e" + "01" + "4a8a4de5" + "95cf0000018bcfe56800a161c40432312e3501a56465762d31" +
			"14" + "01" + "f57ef7ff" + "94cf0000018bcfe56801a162c40000",
		// offset 1024: a batch of one is its version-1 value.
		"7200000001" + "0000000000000400": "01" + "a89b057c" + "94cf0000018bcfe56802a163c40000",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored\n%v\nwant\n%v", got, want)
	}
}

func FuzzParseBatch(f *testing.F) {
	vals := [][]byte{
		encodeRecord(nil, &Record{Offset: 1022, Topic: "a", Payload: []byte("x")}),
		encodeRecord(nil, &Record{Offset: 1023, Topic: "b"}),
	}
	f.Add(uint64(1023), appendBatch(nil, vals))
	f.Add(uint64(1023), vals[1])
	f.Add(uint64(1), appendBatch(nil, vals))              // CRCs over other offsets
	f.Add(uint64(1024), appendBatch(nil, vals))           // crosses a chunk
	f.Add(uint64(7), []byte{batchVersion, 0})             // no records
	f.Add(uint64(7), []byte{batchVersion, 0xff, 0xff})    // unreadable count
	f.Add(uint64(7), []byte{batchVersion, 0x80, 0x08})    // 1024 records in 3 bytes
	f.Add(uint64(7), []byte{batchVersion, 2, 0xff, 0x0f}) // a length past the end
	f.Add(uint64(0), []byte{})
	f.Fuzz(func(t *testing.T, last uint64, v []byte) {
		first, vals, err := parseBatch(last, v, nil)
		if err != nil {
			if len(vals) != 0 {
				t.Fatalf("%d values returned with %v", len(vals), err)
			}
			return
		}
		if first > last || first>>chunkShift != last>>chunkShift || uint64(len(vals)) != last-first+1 {
			t.Fatalf("first %d last %d with %d values", first, last, len(vals))
		}
		if len(vals) > 1 && len(vals)*(1+valueHeader) > len(v) {
			t.Fatalf("%d values from %d bytes", len(vals), len(v))
		}
		total := 0
		for i, rv := range vals {
			total += len(rv)
			if r, err := decodeRecord(first+uint64(i), rv); err == nil && r.Offset != first+uint64(i) {
				t.Fatalf("record %d decoded at offset %d", i, r.Offset)
			}
		}
		if total > len(v) {
			t.Fatalf("values take %d bytes of %d", total, len(v))
		}
		if v[0] == batchVersion && len(vals) > 1 {
			// What a reader accepts, a writer writes back the same way, but
			// for non-minimal varints.
			if again := appendBatch(nil, vals); len(again) > len(v) {
				t.Fatalf("re-encoded %d bytes into %d", len(v), len(again))
			}
		}
	})
}
