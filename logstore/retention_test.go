package logstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// keysUnder counts the keys of stream s holding records in [lo, hi) that
// are physically in Badger (hidden or not): the batches from the one that
// holds lo (the first key at or above it) to the one that starts below hi.
func keysUnder(tb testing.TB, s *Stream, lo, hi uint64) int {
	tb.Helper()
	n := 0
	err := s.st.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagRecord, s.id)})
		defer it.Close()
		for it.Seek(recordKey(s.id, lo)); it.Valid(); it.Next() {
			var first uint64
			if err := it.Item().Value(func(v []byte) (err error) {
				first, _, err = parseBatch(keyOffset(it.Item().Key()), v, nil)
				return err
			}); err != nil {
				return err
			}
			if first >= hi {
				break
			}
			n++
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func TestRetention_ByBytes(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxBytes: 200_000})
	cfg.ReclaimInterval = time.Nanosecond
	st := openStore(t, cfg)
	s := st.Stream("s")
	const n = 70_000 // more than one 65536-offset block
	appendN(t, s, n, 2000)
	// Commits apply retention once a stream is a sixteenth past MaxBytes
	// (retainOnCommit), after their appends are acknowledged.
	if s.FirstOffset() == 0 {
		t.Fatalf("FirstOffset 0 after appending %d bytes, want retention applied as they came", s.Bytes())
	}

	// Appends keep working (and offsets stay contiguous) while retention runs.
	var wg sync.WaitGroup
	wg.Add(1)
	var during []uint64
	go func() {
		defer wg.Done()
		for i := range 50 {
			first, err := s.Append(context.Background(), rec("during", fmt.Sprint(i)))
			if err != nil {
				t.Errorf("append during retention: %v", err)
				return
			}
			during = append(during, first)
		}
	}()
	_, err := s.ApplyRetention(context.Background(), time.Now())
	wg.Wait()
	if err != nil {
		t.Fatalf("ApplyRetention: %v", err)
	}
	for i := 1; i < len(during); i++ {
		if during[i] != during[i-1]+1 {
			t.Fatalf("offsets during retention not contiguous: %v", during)
		}
	}
	if s.NextOffset() != n+50 {
		t.Fatalf("NextOffset = %d, want %d (retention must not move it)", s.NextOffset(), n+50)
	}
	// Retention may have run before some of the 50 concurrent appends: run
	// again so the bound holds for the final log.
	if _, err := s.ApplyRetention(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if s.Bytes() > 200_000 || s.Bytes() < 200_000-2*int64(recordKeyLen+64) {
		t.Fatalf("Bytes = %d after retention, want just under MaxBytes 200000", s.Bytes())
	}
	first := s.FirstOffset()
	if _, err := s.Read(first-1, 1, 0); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("Read below FirstOffset = %v, want ErrOffsetOutOfRange", err)
	}
	recs, err := s.Read(first, 1, 0)
	if err != nil || len(recs) != 1 || recs[0].Offset != first {
		t.Fatalf("Read(FirstOffset) = %v, %v", recs, err)
	}
	// The whole first block was given back with DropPrefix.
	if k := keysUnder(t, s, 0, blockSize); k != 0 {
		t.Fatalf("%d keys of block 0 still stored after reclaim", k)
	}
	if _, err := s.Append(context.Background(), rec("after", "x")); err != nil {
		t.Fatalf("Append after reclaim: %v", err)
	}

	// Reopen: log start, end and byte count survive.
	wantFirst, wantNext, wantBytes := s.FirstOffset(), s.NextOffset(), s.Bytes()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st2 := openStore(t, cfg)
	s2 := st2.Stream("s")
	if s2.FirstOffset() != wantFirst || s2.NextOffset() != wantNext || s2.Bytes() != wantBytes {
		t.Fatalf("after reopen first/next/bytes = %d/%d/%d, want %d/%d/%d",
			s2.FirstOffset(), s2.NextOffset(), s2.Bytes(), wantFirst, wantNext, wantBytes)
	}
}

func TestRetention_ByAge(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxAge: time.Hour})
	st := openStore(t, cfg)
	s := st.Stream("s")
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var recs []*Record
	for i := range 3000 { // one record a second
		recs = append(recs, &Record{Topic: "a", Payload: []byte("x"), Timestamp: base.Add(time.Duration(i) * time.Second).UnixMilli()})
	}
	if _, err := s.Append(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	full := s.Bytes()

	// An hour after record 2500 was written, records 0..2499 are too old.
	now := base.Add(2500*time.Second + time.Hour)
	dropped, err := s.ApplyRetention(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	if dropped != 2500 || s.FirstOffset() != 2500 || s.NextOffset() != 3000 {
		t.Fatalf("dropped %d, first %d, next %d; want 2500, 2500, 3000", dropped, s.FirstOffset(), s.NextOffset())
	}
	if got, want := s.Bytes(), full*500/3000; got != want {
		t.Fatalf("Bytes = %d, want %d (500 of 3000 equal records)", got, want)
	}
	if _, err := s.Read(2499, 1, 0); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("Read(2499) = %v, want ErrOffsetOutOfRange", err)
	}
	if got := readAll(t, s, 2500); len(got) != 500 || got[0].Offset != 2500 {
		t.Fatalf("Read from 2500 gave %d records", len(got))
	}
	// Running it again at the same time drops nothing more.
	if n, err := s.ApplyRetention(context.Background(), now); n != 0 || err != nil {
		t.Fatalf("second ApplyRetention = %d, %v", n, err)
	}
	// Everything expires; offsets continue after the empty log.
	if n, err := s.ApplyRetention(context.Background(), base.Add(10*time.Hour)); n != 500 || err != nil {
		t.Fatalf("ApplyRetention of the rest = %d, %v", n, err)
	}
	if s.FirstOffset() != 3000 || s.Bytes() != 0 {
		t.Fatalf("empty log: first %d bytes %d", s.FirstOffset(), s.Bytes())
	}
	if first, err := s.Append(context.Background(), rec("a", "new")); err != nil || first != 3000 {
		t.Fatalf("Append to emptied log = %d, %v; want 3000", first, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, cfg).Stream("s")
	if s2.FirstOffset() != 3000 || s2.NextOffset() != 3001 || s2.Bytes() == 0 {
		t.Fatalf("after reopen first %d next %d bytes %d", s2.FirstOffset(), s2.NextOffset(), s2.Bytes())
	}
}

func TestRetention_EmptyLogKeepsOffsetsAcrossReopen(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxAge: time.Minute})
	cfg.ReclaimInterval = time.Nanosecond
	st := openStore(t, cfg)
	s := st.Stream("s")
	old := time.Now().Add(-time.Hour).UnixMilli()
	recs := make([]*Record, blockSize+10)
	for i := range recs {
		recs[i] = &Record{Topic: "a", Timestamp: old}
	}
	if _, err := s.Append(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ApplyRetention(context.Background(), time.Now()); err != nil || n != blockSize+10 {
		t.Fatalf("ApplyRetention = %d, %v", n, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, cfg).Stream("s")
	if s2.FirstOffset() != blockSize+10 || s2.NextOffset() != blockSize+10 || s2.Bytes() != 0 {
		t.Fatalf("after reopen first %d next %d bytes %d", s2.FirstOffset(), s2.NextOffset(), s2.Bytes())
	}
	if first, err := s2.Append(context.Background(), rec("a", "x")); err != nil || first != blockSize+10 {
		t.Fatalf("Append = %d, %v; offsets must not repeat", first, err)
	}
}

func TestStream_Truncate(t *testing.T) {
	cfg := testConfig(t)
	st := openStore(t, cfg)
	s := st.Stream("default")
	appendN(t, s, 3000, 500)
	full := s.Bytes()
	ch := s.Changed()
	if err := s.Truncate(context.Background(), 1500); err != nil {
		t.Fatal(err)
	}
	<-ch
	if s.NextOffset() != 1500 || s.Committed() != 1500 {
		t.Fatalf("after Truncate(1500): next %d committed %d", s.NextOffset(), s.Committed())
	}
	if recs, err := s.Read(1500, 10, 0); err != nil || len(recs) != 0 {
		t.Fatalf("Read(1500) = %d records, %v", len(recs), err)
	}
	if s.Bytes() >= full {
		t.Fatalf("Bytes %d after Truncate, want less than %d", s.Bytes(), full)
	}
	if err := s.Truncate(context.Background(), 5000); err != nil {
		t.Fatalf("Truncate above the end = %v", err)
	}
	first, err := s.Append(context.Background(), rec("a", "again"))
	if err != nil || first != 1500 {
		t.Fatalf("Append after Truncate = %d, %v; want 1500", first, err)
	}
	wantBytes := s.Bytes()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st2 := openStore(t, cfg)
	s2 := st2.Stream("default")
	if s2.NextOffset() != 1501 {
		t.Fatalf("after reopen NextOffset = %d, want 1501", s2.NextOffset())
	}
	recs := readAll(t, s2, 0)
	if len(recs) != 1501 || string(recs[1499].Payload) != "p1499" || string(recs[1500].Payload) != "again" {
		t.Fatalf("after reopen %d records, last %q", len(recs), recs[len(recs)-1].Payload)
	}
	if s2.Bytes() != wantBytes {
		t.Fatalf("Bytes %d after reopen, want %d", s2.Bytes(), wantBytes)
	}
	// Truncate below the log start is refused.
	cfg2 := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxAge: time.Minute})
	s3 := openStore(t, cfg2).Stream("s")
	if _, err := s3.Append(context.Background(), &Record{Topic: "a", Timestamp: 1}, &Record{Topic: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s3.ApplyRetention(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s3.Truncate(context.Background(), 0); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("Truncate below FirstOffset = %v, want ErrOffsetOutOfRange", err)
	}
}

// Readers racing appends, retention (with DropPrefix) and truncation see
// records or ErrOffsetOutOfRange, never a corrupt or missing record.
func TestStream_ReadersDuringRetentionAndTruncate(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, MaxBytes: 100_000})
	cfg.ReclaimInterval = time.Nanosecond
	st := openStore(t, cfg)
	s := st.Stream("s")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				from := s.FirstOffset()
				recs, err := s.Read(from, 300, 0)
				switch {
				case errors.Is(err, ErrOffsetOutOfRange):
					// retention moved the start between the two calls
				case err != nil:
					t.Errorf("Read(%d): %v", from, err)
					cancel()
					return
				default:
					for i, rec := range recs {
						if rec.Offset != from+uint64(i) || string(rec.Payload) != fmt.Sprintf("o%d", rec.Offset) {
							t.Errorf("Read(%d)[%d] = offset %d payload %q", from, i, rec.Offset, rec.Payload)
							cancel()
							return
						}
					}
					reads.Add(int64(len(recs)))
				}
			}
		}()
	}
	// Each payload names its offset (this test is the only writer).
	appendOffsets := func(n int) {
		next := s.NextOffset()
		recs := make([]*Record, n)
		for i := range recs {
			recs[i] = rec("a", fmt.Sprintf("o%d", next+uint64(i)))
		}
		if first, err := s.Append(context.Background(), recs...); err != nil || first != next {
			t.Fatalf("Append = %d, %v; want %d", first, err, next)
		}
	}
	for i := 0; i < 36 && ctx.Err() == nil; i++ {
		appendOffsets(2000)
		if _, err := s.ApplyRetention(context.Background(), time.Now()); err != nil {
			t.Fatal(err)
		}
		if i%5 == 4 {
			if err := s.Truncate(context.Background(), s.NextOffset()-1000); err != nil {
				t.Fatal(err)
			}
			appendOffsets(1000)
		}
	}
	cancel()
	wg.Wait()
	if s.NextOffset() != 72_000 || s.FirstOffset() < blockSize {
		t.Fatalf("next %d first %d", s.NextOffset(), s.FirstOffset())
	}
	if k := keysUnder(t, s, 0, blockSize); k != 0 {
		t.Fatalf("%d keys of block 0 left after reclaim", k)
	}
	if reads.Load() == 0 {
		t.Fatal("the readers never read a record")
	}
}
