package logstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// commits is how many group commits the store has made (the batch size
// histogram's sample count).
func commits(tb testing.TB, st *Store) uint64 {
	tb.Helper()
	var m dto.Metric
	if err := st.metrics.BatchRecords.Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// appendSpaced appends n single records gap apart, without waiting for
// them, and waits until all are done; it returns their offsets.
func appendSpaced(tb testing.TB, s *Stream, n int, gap time.Duration) []uint64 {
	tb.Helper()
	type result struct {
		i   int
		off uint64
		err error
	}
	done := make(chan result, n)
	for i := range n {
		s.AppendAsync([]*Record{rec("t", fmt.Sprint(i))}, func(off uint64, err error) { done <- result{i, off, err} })
		time.Sleep(gap)
	}
	offs := make([]uint64, n)
	for range n {
		r := <-done
		if r.err != nil {
			tb.Fatalf("append %d: %v", r.i, r.err)
		}
		offs[r.i] = r.off
	}
	return offs
}

func TestStream_LingerSharesCommitsAmongLoneAppends(t *testing.T) {
	for _, d := range []Durability{DurabilityFsync, DurabilityInterval} {
		t.Run(string(d), func(t *testing.T) {
			// Five publishes 5 ms apart: without a linger each is its own
			// commit (and fsync); with a linger longer than all five
			// they share one.
			without := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: d}))
			appendSpaced(t, without.Stream("s"), 5, 5*time.Millisecond)
			if n := commits(t, without); n < 2 {
				t.Fatalf("without linger: %d commits for 5 spaced appends, want several (the test cannot tell otherwise)", n)
			}

			st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: d,
				Linger: 500 * time.Millisecond}))
			offs := appendSpaced(t, st.Stream("s"), 5, 5*time.Millisecond)
			if n := commits(t, st); n != 1 {
				t.Errorf("with a 500ms linger: %d commits for 5 appends 5 ms apart, want 1", n)
			}
			for i, off := range offs {
				if off != uint64(i) {
					t.Errorf("append %d got offset %d, want %d (arrival order)", i, off, i)
				}
			}
			got := readAll(t, st.Stream("s"), 0)
			if len(got) != 5 || string(got[4].Payload) != "4" {
				t.Errorf("read back %d records", len(got))
			}
		})
	}
}

// A full batch does not wait out the linger.
func TestStream_LingerEndsWithAFullBatch(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Linger: MaxLinger}))
	s := st.Stream("s")
	recs := make([]*Record, maxBatchRecords)
	for i := range recs {
		recs[i] = rec("t", "x")
	}
	start := time.Now()
	done := make(chan error, 1)
	s.AppendAsync(recs, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= MaxLinger {
		t.Errorf("a full batch waited %v, the whole linger", took)
	}
}

// Closing the store does not wait out a linger; the lingering append is
// failed, never lost silently or acknowledged.
func TestStream_LingerEndsOnClose(t *testing.T) {
	st, err := Open(testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Linger: MaxLinger}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	st.Stream("s").AppendAsync([]*Record{rec("t", "x")}, func(_ uint64, err error) { done <- err })
	start := time.Now()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= MaxLinger {
		t.Errorf("Close waited %v, the whole linger", took)
	}
	if err := <-done; !errors.Is(err, ErrClosed) && err != nil {
		t.Errorf("lingering append: %v, want success or ErrClosed", err)
	}
}

func TestConfig_LingerBounds(t *testing.T) {
	for _, d := range []time.Duration{-time.Millisecond, MaxLinger + 1} {
		cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Linger: d})
		if err := cfg.Validate(); err == nil {
			t.Errorf("linger %v accepted", d)
		}
	}
}
