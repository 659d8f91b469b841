package logtest

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// testReadBounds: Read from the log start and the middle, empty at
// Committed, out of range above it.
func testReadBounds(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	if got, err := st.Read(0, 10, 0); err != nil || len(got) != 0 {
		t.Fatalf("Read(0) of an empty stream = %d records, %v; want none, nil", len(got), err)
	}
	_, err := st.Read(1, 10, 0)
	wantErr(t, "Read(1) of an empty stream", err, logstore.ErrOffsetOutOfRange)

	want := recs(5)
	mustAppend(t, st, want...)
	got, err := st.Read(0, 0, 0)
	if err != nil {
		t.Fatalf("Read(0): %v", err)
	}
	checkOffsets(t, got, 0, want)
	got, err = st.Read(3, 0, 0)
	if err != nil {
		t.Fatalf("Read(3): %v", err)
	}
	checkOffsets(t, got, 3, want[3:])
	if got, err := st.Read(5, 10, 0); err != nil || len(got) != 0 {
		t.Fatalf("Read(Committed) = %d records, %v; want none, nil", len(got), err)
	}
	_, err = st.Read(6, 10, 0)
	wantErr(t, "Read(Committed+1)", err, logstore.ErrOffsetOutOfRange)
}

// testReadLimits: max records and maxBytes of Record.Size, with <= 0 as no
// limit and the first record always returned.
func testReadLimits(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	want := recs(10) // Record.Size 100 each
	big := rec("big", 1000)
	want = append(want, big, rec("after", 100))
	mustAppend(t, st, want...)
	checkReadLimits(t, st, want)
}

// checkReadLimits checks Read's limits on a stream holding want (ten
// records of size 100, one of 1000, one of 100) from offset 0.
func checkReadLimits(t *testing.T, st mqtt.Stream, want []*logstore.Record) {
	t.Helper()
	for _, tc := range []struct {
		from          uint64
		max, maxBytes int
		n             int
	}{
		{0, 3, 0, 3},
		{0, 3, 1 << 20, 3},
		{0, 0, 250, 2},   // 300 bytes would pass 250
		{0, 0, 300, 3},   // exactly at the limit
		{0, -1, -1, 12},  // negative: no limit either
		{2, 100, 50, 1},  // a record larger than maxBytes alone still comes
		{10, 0, 500, 1},  // the big one alone
		{9, 0, 500, 1},   // stops before the big one
		{9, 0, 1100, 2},  // 100 + 1000
		{4, 4, 10000, 4}, // max before maxBytes
		{11, 5, 1 << 20, 1},
	} {
		got, err := st.Read(tc.from, tc.max, tc.maxBytes)
		if err != nil {
			t.Fatalf("Read(%d, %d, %d): %v", tc.from, tc.max, tc.maxBytes, err)
		}
		if len(got) != tc.n {
			t.Fatalf("Read(%d, %d, %d) = %d records, want %d", tc.from, tc.max, tc.maxBytes, len(got), tc.n)
		}
		checkOffsets(t, got, tc.from, want[tc.from:tc.from+uint64(tc.n)])
	}
}

// timed is n records with timestamps base, base+10ms, ...
func timed(base time.Time, n int) []*logstore.Record {
	out := recs(n)
	for i, r := range out {
		r.Timestamp = base.Add(time.Duration(i) * 10 * time.Millisecond).UnixMilli()
	}
	return out
}

// testBase is the time of the first timed record: fixed and long ago.
var testBase = time.UnixMilli(1_700_000_000_000)

// testOffsetForTime: the first offset at or after t, Committed when every
// record is older.
func testOffsetForTime(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	if off, err := st.OffsetForTime(testBase); err != nil || off != 0 {
		t.Fatalf("OffsetForTime on an empty stream = %d, %v; want 0, nil", off, err)
	}
	mustAppend(t, st, timed(testBase, 5)...) // at +0, +10, ... +40 ms
	ms := time.Millisecond
	for _, tc := range []struct {
		at   time.Time
		want uint64
	}{
		{testBase.Add(-time.Hour), 0},
		{testBase, 0},
		{testBase.Add(1 * ms), 1},
		{testBase.Add(10 * ms), 1},
		{testBase.Add(35 * ms), 4},
		{testBase.Add(40 * ms), 4},
		{testBase.Add(41 * ms), 5}, // every record older: Committed
	} {
		if off, err := st.OffsetForTime(tc.at); err != nil || off != tc.want {
			t.Errorf("OffsetForTime(base%+v) = %d, %v; want %d", tc.at.Sub(testBase), off, err, tc.want)
		}
	}
}

// testReadBelowStart: after retention, FirstOffset has moved, a Read below
// it is out of range, and OffsetForTime never answers below it.
func testReadBelowStart(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	want := timed(testBase, 5)
	mustAppend(t, st, want...)
	s.Expire(t, st, testBase.Add(25*time.Millisecond)) // drops 0, 1, 2
	if got := st.FirstOffset(); got != 3 {
		t.Fatalf("FirstOffset after retention = %d, want 3", got)
	}
	if got := st.Committed(); got != 5 {
		t.Fatalf("Committed after retention = %d, want 5", got)
	}
	_, err := st.Read(2, 10, 0)
	wantErr(t, "Read below FirstOffset", err, logstore.ErrOffsetOutOfRange)
	got, err := st.Read(3, 10, 0)
	if err != nil {
		t.Fatalf("Read(FirstOffset): %v", err)
	}
	checkOffsets(t, got, 3, want[3:])
	if off, err := st.OffsetForTime(testBase); err != nil || off != 3 {
		t.Fatalf("OffsetForTime(before the log start) = %d, %v; want FirstOffset 3", off, err)
	}
	if first := mustAppend(t, st, recs(1)...); first != 5 {
		t.Fatalf("append after retention: first %d, want 5", first)
	}

	// Retention of every record: the log is empty at offset 6, not 0.
	s.Expire(t, st, time.Now().Add(time.Hour))
	if f, c := st.FirstOffset(), st.Committed(); f != 6 || c != 6 {
		t.Fatalf("after retention of every record: FirstOffset %d Committed %d, want 6 6", f, c)
	}
	if got, err := st.Read(6, 10, 0); err != nil || len(got) != 0 {
		t.Fatalf("Read(Committed) of an emptied stream = %d records, %v; want none, nil", len(got), err)
	}
	if off, err := st.OffsetForTime(testBase); err != nil || off != 6 {
		t.Fatalf("OffsetForTime on an emptied stream = %d, %v; want 6", off, err)
	}
	if first := mustAppend(t, st, recs(1)...); first != 6 {
		t.Fatalf("append to an emptied stream: first %d, want 6", first)
	}
}

// testChangedWakes: a channel taken before an append is closed by it; a
// new channel is open again.
func testChangedWakes(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	ch := st.Changed()
	mustAppend(t, st, recs(1)...)
	waitClosed(t, "after an append", ch)
	// Taking a fresh channel and appending again must close it again.
	ch = st.Changed()
	st.AppendAsync(recs(1), func(uint64, error) {})
	waitClosed(t, "after a second append", ch)
	for st.Committed() < 2 {
		ch = st.Changed()
		if st.Committed() >= 2 {
			break
		}
		waitClosed(t, "waiting for the second commit", ch)
	}
}

// testNoLostWakeup: waiters that take Changed, check Committed and then
// wait see every append. In each round the waiters are asleep (or about
// to be) when the next record commits, and the round ends only when all
// of them have seen it: an implementation that loses a wake-up leaves one
// asleep until the deadline.
func testNoLostWakeup(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	const rounds, waiters = 300, 4
	var wg sync.WaitGroup
	seen := make(chan uint64, waiters)
	errs := make(chan string, waiters)
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.After(Deadline)
			var last uint64
			for {
				ch := st.Changed()
				c := st.Committed()
				if c < last {
					errs <- "Committed went backwards"
					return
				}
				if c > last {
					// Read what the wake-up announced, racing with the appender.
					got, err := st.Read(last, 0, 0)
					if err != nil || len(got) == 0 || got[0].Offset != last {
						errs <- fmt.Sprintf("Read(%d) below Committed %d: %d records, %v", last, c, len(got), err)
						return
					}
					last = c
					seen <- c
				}
				if c >= rounds {
					return
				}
				select {
				case <-ch:
				case <-deadline:
					errs <- "a waiter was never woken: it saw Committed " + strconv.FormatUint(c, 10) +
						", now " + strconv.FormatUint(st.Committed(), 10)
					return
				}
			}
		}()
	}
	for i := range uint64(rounds) {
		st.AppendAsync(recs(1), func(uint64, error) {})
		for reached := 0; reached < waiters; {
			select {
			case c := <-seen:
				if c >= i+1 {
					reached++
				}
			case e := <-errs:
				t.Fatal(e)
			}
		}
	}
	wg.Wait()
}

// testReadLong: a stream longer than any cache an implementation may keep
// (logstore: 1024-offset chunks, a 2048-record tail) reads back whole, in
// batches that cross every boundary, and OffsetForTime finds records
// anywhere in it.
func testReadLong(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	const n, per = 5000, 1000
	want := make([]*logstore.Record, 0, n)
	for i := 0; i < n; i += per {
		batch := recs(per)
		for j, r := range batch {
			r.Topic = "long/" + strconv.Itoa(i+j)
			r.Timestamp = testBase.Add(time.Duration(i+j) * time.Millisecond).UnixMilli()
		}
		mustAppend(t, st, batch...)
		want = append(want, batch...)
	}
	for _, lim := range []struct{ max, maxBytes int }{{700, 0}, {0, 30_000}, {333, 25_000}} {
		var got []*logstore.Record
		for from := uint64(0); from < n; {
			b, err := st.Read(from, lim.max, lim.maxBytes)
			if err != nil || len(b) == 0 {
				t.Fatalf("Read(%d, %d, %d) = %d records, %v", from, lim.max, lim.maxBytes, len(b), err)
			}
			if (lim.max > 0 && len(b) > lim.max) || (lim.maxBytes > 0 && len(b)*100 > lim.maxBytes) {
				t.Fatalf("Read(%d, %d, %d) = %d records: over the limit", from, lim.max, lim.maxBytes, len(b))
			}
			if lim.max > 0 && lim.maxBytes == 0 && len(b) != min(lim.max, n-int(from)) {
				t.Fatalf("Read(%d, %d, 0) = %d records, want %d", from, lim.max, len(b), min(lim.max, n-int(from)))
			}
			got = append(got, b...)
			from += uint64(len(b))
		}
		checkOffsets(t, got, 0, want)
	}
	for _, off := range []int{0, 1023, 1024, 2047, 3000, 4999} {
		at := testBase.Add(time.Duration(off) * time.Millisecond)
		if got, err := st.OffsetForTime(at); err != nil || got != uint64(off) {
			t.Fatalf("OffsetForTime(base+%dms) = %d, %v; want %d", off, got, err, off)
		}
	}
}
