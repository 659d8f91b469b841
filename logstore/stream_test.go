package logstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestStream_AppendAndReadFromOffset(t *testing.T) {
	st := openStore(t, testConfig(t))
	s := st.Stream("default")
	pf := byte(1)
	full := &Record{
		Timestamp: 1700000000123, Topic: "sensors/a", Payload: []byte("hello"), QoS: 2, Retain: true,
		ClientID: "c1", ContentType: "text/plain", PayloadFormat: &pf, ResponseTopic: "r/1",
		CorrelationData: []byte{1, 2, 3}, UserProperties: []UserProperty{{"k", "v"}, {"k", "w"}},
	}
	first, err := s.Append(context.Background(), full)
	if err != nil || first != 0 {
		t.Fatalf("Append = %d, %v; want 0, nil", first, err)
	}
	appendN(t, s, 9, 3)
	if got := s.NextOffset(); got != 10 {
		t.Fatalf("NextOffset = %d, want 10", got)
	}
	if got := s.Committed(); got != 10 {
		t.Fatalf("Committed = %d, want 10", got)
	}

	t.Run("every field round-trips", func(t *testing.T) {
		recs, err := s.Read(0, 1, 0)
		if err != nil || len(recs) != 1 {
			t.Fatalf("Read(0,1) = %d records, %v", len(recs), err)
		}
		if !reflect.DeepEqual(recs[0], full) {
			t.Fatalf("read back\n%+v\nwant\n%+v", recs[0], full)
		}
	})
	t.Run("from an offset", func(t *testing.T) {
		recs, err := s.Read(4, 100, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 6 || recs[0].Offset != 4 || string(recs[0].Payload) != "p3" || recs[5].Offset != 9 {
			t.Fatalf("Read(4) = %d records starting %d %q", len(recs), recs[0].Offset, recs[0].Payload)
		}
		if recs[0].Timestamp == 0 {
			t.Fatal("appender did not stamp a timestamp")
		}
	})
	t.Run("max records", func(t *testing.T) {
		recs, _ := s.Read(2, 3, 0)
		if len(recs) != 3 || recs[2].Offset != 4 {
			t.Fatalf("Read(2, 3) = %d records", len(recs))
		}
	})
	t.Run("max bytes returns at least one", func(t *testing.T) {
		recs, _ := s.Read(1, 100, 1)
		if len(recs) != 1 || recs[0].Offset != 1 {
			t.Fatalf("Read(1, maxBytes 1) = %d records", len(recs))
		}
		sz := recs[0].Size()
		recs, _ = s.Read(1, 100, 2*sz+1)
		if len(recs) != 2 {
			t.Fatalf("Read(1, maxBytes 2 records) = %d records", len(recs))
		}
	})
	t.Run("at committed is empty", func(t *testing.T) {
		recs, err := s.Read(10, 100, 0)
		if err != nil || recs == nil || len(recs) != 0 {
			t.Fatalf("Read(10) = %v, %v; want empty, nil", recs, err)
		}
	})
	t.Run("above committed is out of range", func(t *testing.T) {
		_, err := s.Read(11, 100, 0)
		if !errors.Is(err, ErrOffsetOutOfRange) {
			t.Fatalf("Read(11) err = %v, want ErrOffsetOutOfRange", err)
		}
	})
	t.Run("unknown stream", func(t *testing.T) {
		if st.Stream("nope") != nil {
			t.Fatal("Stream(nope) is not nil")
		}
	})
}

func TestStore_ReopenKeepsRecordsAndOffsetsContinue(t *testing.T) {
	cfg := testConfig(t,
		StreamConfig{Name: "a", Filters: []string{"a/#"}},
		StreamConfig{Name: "b", Filters: []string{"b/#"}, Durability: DurabilityInterval})
	st, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, st.Stream("a"), 2500, 100)
	appendN(t, st.Stream("b"), 7, 7)
	bytesA := st.Stream("a").Bytes()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopen with the streams in the other order: ids come from the store.
	cfg.Streams[0], cfg.Streams[1] = cfg.Streams[1], cfg.Streams[0]
	st = openStore(t, cfg)
	a, b := st.Stream("a"), st.Stream("b")
	if a.NextOffset() != 2500 || b.NextOffset() != 7 {
		t.Fatalf("after reopen NextOffset a=%d b=%d, want 2500 and 7", a.NextOffset(), b.NextOffset())
	}
	if a.Bytes() != bytesA {
		t.Fatalf("after reopen Bytes = %d, want %d", a.Bytes(), bytesA)
	}
	first, err := a.Append(context.Background(), rec("a/x", "new"))
	if err != nil || first != 2500 {
		t.Fatalf("Append after reopen = %d, %v; want 2500", first, err)
	}
	recs := readAll(t, a, 0)
	for i, r := range recs[:2500] {
		if want := fmt.Sprintf("p%d", i); string(r.Payload) != want || r.Offset != uint64(i) {
			t.Fatalf("record %d = offset %d %q, want %q", i, r.Offset, r.Payload, want)
		}
	}
	if string(recs[2500].Payload) != "new" {
		t.Fatalf("last record %q", recs[2500].Payload)
	}
	if names := []string{st.Streams()[0].Name(), st.Streams()[1].Name()}; names[0] != "b" || names[1] != "a" {
		t.Fatalf("Streams() order %v, want config order [b a]", names)
	}
}

func TestStream_GroupCommitConcurrentAppenders(t *testing.T) {
	st := openStore(t, testConfig(t))
	s := st.Stream("default")
	const writers, each = 32, 60
	offsets := make([][]uint64, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				n := 1 + i%3
				recs := make([]*Record, n)
				for j := range recs {
					recs[j] = rec(fmt.Sprintf("w/%d", w), fmt.Sprintf("%d/%d/%d", w, i, j))
				}
				first, err := s.Append(context.Background(), recs...)
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				for j, r := range recs {
					if r.Offset != first+uint64(j) {
						t.Errorf("record %d of a request has offset %d, want %d", j, r.Offset, first+uint64(j))
					}
					offsets[w] = append(offsets[w], r.Offset)
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	seen := map[uint64]bool{}
	for w, offs := range offsets {
		for i, o := range offs {
			if seen[o] {
				t.Fatalf("offset %d given twice", o)
			}
			seen[o] = true
			if i > 0 && o <= offs[i-1] {
				t.Fatalf("writer %d: offset %d after %d", w, o, offs[i-1])
			}
		}
		total += len(offs)
	}
	if s.NextOffset() != uint64(total) {
		t.Fatalf("NextOffset = %d, want %d", s.NextOffset(), total)
	}
	for o := range uint64(total) {
		if !seen[o] {
			t.Fatalf("offset %d never given", o)
		}
	}
	// What was read back is what each writer sent at that offset.
	byOffset := map[uint64]string{}
	for w := range writers {
		k := 0
		for i := range each {
			for j := range 1 + i%3 {
				byOffset[offsets[w][k]] = fmt.Sprintf("%d/%d/%d", w, i, j)
				k++
			}
		}
	}
	for _, r := range readAll(t, s, 0) {
		if string(r.Payload) != byOffset[r.Offset] {
			t.Fatalf("offset %d holds %q, want %q", r.Offset, r.Payload, byOffset[r.Offset])
		}
	}
}

func TestStream_AppendAsyncCallsDoneInOrder(t *testing.T) {
	st := openStore(t, testConfig(t))
	s := st.Stream("default")
	const n = 2000
	var mu sync.Mutex
	var order []int
	var firsts []uint64
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		recs := []*Record{rec("a", fmt.Sprint(i))}
		if i%10 == 0 {
			recs = append(recs, rec("a", fmt.Sprint(i, "b")))
		}
		s.AppendAsync(recs, func(first uint64, err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("append %d: %v", i, err)
			}
			mu.Lock()
			order = append(order, i)
			firsts = append(firsts, first)
			mu.Unlock()
		})
	}
	wg.Wait()
	next := uint64(0)
	for k, i := range order {
		if i != k {
			t.Fatalf("done call %d was for append %d", k, i)
		}
		if firsts[k] != next {
			t.Fatalf("append %d got first offset %d, want %d", i, firsts[k], next)
		}
		next++
		if i%10 == 0 {
			next++
		}
	}
	if s.NextOffset() != next {
		t.Fatalf("NextOffset = %d, want %d", s.NextOffset(), next)
	}
}

func TestStream_AppendRefusesNilRecord(t *testing.T) {
	st := openStore(t, testConfig(t))
	s := st.Stream("default")
	if _, err := s.Append(context.Background(), rec("a", "1"), nil); !errors.Is(err, ErrNilRecord) {
		t.Fatalf("Append(nil) err = %v, want ErrNilRecord", err)
	}
	if first, err := s.Append(context.Background(), rec("a", "2")); err != nil || first != 0 {
		t.Fatalf("next Append = %d, %v; want offset 0", first, err)
	}
}

func TestStream_ChangedAndWait(t *testing.T) {
	st, err := Open(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	s := st.Stream("default")
	ch := s.Changed()
	waited := make(chan error, 1)
	go func() { waited <- s.Wait(context.Background(), 0) }()
	select {
	case <-ch:
		t.Fatal("Changed closed before any append")
	default:
	}
	if _, err := s.Append(context.Background(), rec("a", "1")); err != nil {
		t.Fatal(err)
	}
	<-ch // closed by the commit; a hang here fails the test by timeout
	if err := <-waited; err != nil {
		t.Fatalf("Wait = %v", err)
	}
	if err := s.Wait(context.Background(), 0); err != nil {
		t.Fatalf("Wait on a committed offset = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Wait(ctx, 5); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with cancelled ctx = %v", err)
	}
	go func() { waited <- s.Wait(context.Background(), 5) }()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait across Close = %v, want ErrClosed", err)
	}
	<-s.Changed() // stays closed after Close
}

func TestStore_CloseIsIdempotentAndFailsQueuedAppends(t *testing.T) {
	st, err := Open(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	s := st.Stream("default")
	// Hold commits (as DropPrefix would) so appends queue up behind one.
	st.writeMu.Lock()
	results := make(chan error, 3)
	for i := range 3 {
		s.AppendAsync([]*Record{rec("a", fmt.Sprint(i))}, func(_ uint64, err error) { results <- err })
		if i == 0 { // let the appender take the first alone and block on it
			for queued(s) > 0 {
				runtime.Gosched()
			}
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- st.Close() }()
	<-st.stopping
	st.writeMu.Unlock()
	if err := <-closed; err != nil {
		t.Fatalf("Close = %v", err)
	}
	var ok, failed int
	for range 3 {
		switch err := <-results; {
		case err == nil:
			ok++
		case errors.Is(err, ErrClosed):
			failed++
		default:
			t.Fatalf("queued append failed with %v, want ErrClosed", err)
		}
	}
	if failed == 0 {
		t.Fatal("no queued append failed with ErrClosed")
	}
	if err := st.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := s.Append(context.Background(), rec("a", "late")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Read(0, 1, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Read after Close = %v, want ErrClosed", err)
	}
	if err := s.Truncate(context.Background(), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Truncate after Close = %v, want ErrClosed", err)
	}
}

func TestStore_CloseLeavesNoGoroutines(t *testing.T) {
	before := runtimeGoroutines()
	for range 3 {
		st, err := Open(testConfig(t, StreamConfig{Name: "a", Filters: []string{"#"}, Durability: DurabilityInterval}))
		if err != nil {
			t.Fatal(err)
		}
		appendN(t, st.Stream("a"), 10, 5)
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Badger's own goroutines end asynchronously after Close; wait for the
	// count to come back, and fail if it never does.
	deadline := time.Now().Add(10 * time.Second)
	for runtimeGoroutines() > before {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines: %d before, %d after Close\n%s", before, runtimeGoroutines(), goroutineDump())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStream_ManualCommit(t *testing.T) {
	cfg := testConfig(t)
	cfg.ManualCommit = true
	st := openStore(t, cfg)
	s := st.Stream("default")
	appendN(t, s, 5, 5)
	if s.Committed() != 0 || s.NextOffset() != 5 {
		t.Fatalf("Committed %d NextOffset %d, want 0 and 5", s.Committed(), s.NextOffset())
	}
	if recs, err := s.Read(0, 10, 0); err != nil || len(recs) != 0 {
		t.Fatalf("Read of uncommitted = %d records, %v; want none", len(recs), err)
	}
	ch := s.Changed()
	setHW(t, s, 3)
	<-ch
	if recs, _ := s.Read(0, 10, 0); len(recs) != 3 {
		t.Fatalf("Read after SetHighWatermark(3) = %d records", len(recs))
	}
	setHW(t, s, 99)
	if s.Committed() != 5 {
		t.Fatalf("SetHighWatermark(99) gave %d, want clamp to 5", s.Committed())
	}
	setHW(t, s, 1)
	if s.Committed() != 5 {
		t.Fatal("SetHighWatermark moved the watermark down")
	}
}

func TestStream_OffsetForTime(t *testing.T) {
	st := openStore(t, testConfig(t))
	s := st.Stream("default")
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var recs []*Record
	for i := range 3000 {
		recs = append(recs, &Record{Topic: "a", Timestamp: base.Add(time.Duration(i) * time.Second).UnixMilli()})
	}
	if _, err := s.Append(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		at   time.Time
		want uint64
	}{
		{base.Add(-time.Hour), 0},
		{base, 0},
		{base.Add(1500*time.Second + time.Millisecond), 1501},
		{base.Add(2047 * time.Second), 2047},
		{base.Add(2999 * time.Second), 2999},
		{base.Add(time.Hour), 3000},
	} {
		got, err := s.OffsetForTime(tc.at)
		if err != nil || got != tc.want {
			t.Errorf("OffsetForTime(%v) = %d, %v; want %d", tc.at.Sub(base), got, err, tc.want)
		}
	}
	_ = bytes.MinRead
}

func queued(s *Stream) int {
	s.q.Lock()
	defer s.q.Unlock()
	return len(s.q.reqs)
}

func TestStream_LargeRecordsAndInMemory(t *testing.T) {
	for _, inMem := range []bool{false, true} {
		t.Run(fmt.Sprint("in-memory=", inMem), func(t *testing.T) {
			cfg := testConfig(t)
			if inMem {
				cfg.InMemory, cfg.Dir = true, ""
				cfg.Profile = ProfileServer // 64 KiB value threshold, the in-memory record limit
			}
			cfg.Streams[0].MaxBytes = 3 << 20
			if inMem {
				// One and a half of the largest record: 64 KiB, or 1 KiB on
				// 32-bit platforms (profile.go, for32Bit).
				probe, err := Open(cfg)
				if err != nil {
					t.Fatal(err)
				}
				cfg.Streams[0].MaxBytes = 3 * int64(probe.MaxRecordBytes()) / 2
				if err := probe.Close(); err != nil {
					t.Fatal(err)
				}
			}
			s := openStore(t, cfg).Stream("default")
			st := s.st
			big := bytes.Repeat([]byte("x"), min(2<<20, st.MaxRecordBytes()-100)) // above pi-zero's transaction limit
			var recs []*Record
			for i := range 3 {
				recs = append(recs, &Record{Topic: "big", Payload: big}, rec("small", fmt.Sprint(i)))
			}
			if _, err := s.Append(context.Background(), recs...); err != nil {
				t.Fatalf("Append of 2 MiB records: %v", err)
			}
			// Retention on commit may already have dropped the oldest: read
			// what is left, which must end with the last big record.
			first := s.FirstOffset()
			got := readAll(t, s, first)
			if n := len(got); uint64(n) != 6-first || !bytes.Equal(got[n-2].Payload, big) || string(got[n-1].Payload) != "2" {
				t.Fatalf("read back %d records from offset %d", n, first)
			}
			if _, err := s.ApplyRetention(context.Background(), time.Now()); err != nil {
				t.Fatal(err)
			}
			if s.Bytes() > cfg.Streams[0].MaxBytes || s.FirstOffset() != 3 {
				t.Fatalf("after size retention: Bytes %d, FirstOffset %d; want <= %d from offset 3", s.Bytes(), s.FirstOffset(), cfg.Streams[0].MaxBytes)
			}
			tooBig := &Record{Topic: "big", Payload: make([]byte, st.MaxRecordBytes()+1)}
			_, err := s.Append(context.Background(), rec("a", "fits"), tooBig)
			if !errors.Is(err, ErrRecordTooLarge) || len(err.Error()) > 200 {
				t.Fatalf("Append of a record above MaxRecordBytes = %.300v, want a short ErrRecordTooLarge", err)
			}
			if first, err := s.Append(context.Background(), rec("a", "next")); err != nil || first != 6 {
				t.Fatalf("Append after a refused one = %d, %v; want offset 6 (refused requests take no offsets)", first, err)
			}
		})
	}
}
