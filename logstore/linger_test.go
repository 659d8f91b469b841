package logstore

import (
	"errors"
	"fmt"
	"strings"
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

// appendSpaced appends n single records of QoS 1 gap apart, without waiting
// for them, and waits until all are done; it returns their offsets.
func appendSpaced(tb testing.TB, s *Stream, n int, gap time.Duration) []uint64 {
	return appendSpacedQoS(tb, s, n, gap, 1)
}

func appendSpacedQoS(tb testing.TB, s *Stream, n int, gap time.Duration, qos byte) []uint64 {
	tb.Helper()
	type result struct {
		i   int
		off uint64
		err error
	}
	done := make(chan result, n)
	for i := range n {
		r := rec("t", fmt.Sprint(i))
		r.QoS = qos
		s.AppendAsync([]*Record{r}, func(off uint64, err error) { done <- result{i, off, err} })
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

// appendOne appends one record of the given QoS and waits for it.
func appendOne(tb testing.TB, s *Stream, qos byte) uint64 {
	tb.Helper()
	return appendSpacedQoS(tb, s, 1, 0, qos)[0]
}

// The timing of lingering (how long an append waits, and that some do not
// wait at all) is measured by the BenchmarkLinger_* benchmarks in
// linger_bench_test.go. These tests check what does not depend on the
// machine's speed: which appends share a commit, and in what order.

// Appends that arrive one by one soon after a commit share the next one:
// the first, to a quiet stream, commits alone; the four after it, each
// queued while the others linger, commit together, in arrival order.
func TestStream_LingerSharesCommitsAmongLoneAppends(t *testing.T) {
	for _, d := range []Durability{DurabilityFsync, DurabilityInterval} {
		t.Run(string(d), func(t *testing.T) {
			// MaxLinger (1 s) is far longer than the 20 ms the four
			// appends take to arrive, on any machine.
			st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: d,
				Linger: MaxLinger}))
			s := st.Stream("s")
			if off := appendOne(t, s, 1); off != 0 {
				t.Fatalf("first append at offset %d", off)
			}
			if n := commits(t, st); n != 1 {
				t.Fatalf("%d commits after the first append, want 1", n)
			}
			offs := appendSpaced(t, s, 4, 5*time.Millisecond)
			if n := commits(t, st); n != 2 {
				t.Errorf("%d commits for 1 + 4 appends 5 ms apart with a 1 s linger, want 2 (the first alone, then the rest)", n)
			}
			for i, off := range offs {
				if want := uint64(i + 1); off != want {
					t.Errorf("append %d got offset %d, want %d (arrival order)", i+1, off, want)
				}
			}
			got := readAll(t, s, 0)
			if len(got) != 5 || string(got[4].Payload) != "3" {
				t.Errorf("read back %d records", len(got))
			}
		})
	}
}

// Linger paces commits, it does not merge appends that come one after
// another: each waits for its own commit.
func TestStream_LingerKeepsSequentialAppendsApart(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Linger: 20 * time.Millisecond}))
	s := st.Stream("s")
	for want := range uint64(3) {
		if off := appendOne(t, s, 1); off != want {
			t.Fatalf("append got offset %d, want %d", off, want)
		}
	}
	if n := commits(t, st); n != 3 {
		t.Errorf("%d commits for 3 appends one after another, want 3", n)
	}
}

// A full batch commits as one, whatever the linger.
func TestStream_LingerFullBatchIsOneCommit(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Linger: MaxLinger}))
	s := st.Stream("s")
	appendOne(t, s, 1) // a commit now: what follows lingers
	before := commits(t, st)
	recs := make([]*Record, maxBatchRecords)
	for i := range recs {
		recs[i] = rec("t", "x")
	}
	done := make(chan error, 1)
	s.AppendAsync(recs, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := commits(t, st) - before; n != 1 {
		t.Errorf("%d commits for one full batch, want 1", n)
	}
}

// Closing the store ends a linger: the lingering append is failed or
// committed, never lost silently.
func TestStream_LingerEndsOnClose(t *testing.T) {
	st, err := Open(testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Linger: MaxLinger}))
	if err != nil {
		t.Fatal(err)
	}
	appendOne(t, st.Stream("s"), 1) // a commit now: the next append lingers
	done := make(chan error, 1)
	st.Stream("s").AppendAsync([]*Record{rec("t", "x")}, func(_ uint64, err error) { done <- err })
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) && err != nil {
		t.Errorf("lingering append: %v, want success or ErrClosed", err)
	}
}

// QoS 0 appends linger by their own setting: spaced QoS 0 appends after a
// commit share one, in arrival order.
func TestStream_QoS0LingerSharesCommitsAmongQoS0Appends(t *testing.T) {
	for _, d := range []Durability{DurabilityFsync, DurabilityInterval} {
		t.Run(string(d), func(t *testing.T) {
			st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: d,
				LingerQoS0: MaxLinger}))
			s := st.Stream("s")
			appendOne(t, s, 1) // a commit now: the QoS 0 appends linger
			before := commits(t, st)
			offs := appendSpacedQoS(t, s, 5, 5*time.Millisecond, 0)
			if n := commits(t, st) - before; n != 1 {
				t.Errorf("QoS 0: %d commits for 5 appends 5 ms apart with a 1 s QoS 0 linger, want 1", n)
			}
			for i, off := range offs {
				if want := uint64(1 + i); off != want {
					t.Errorf("QoS 0 append %d got offset %d, want %d (arrival order)", i, off, want)
				}
			}
		})
	}
}

// A QoS 1 append takes the QoS 0 appends queued before it along, in order,
// in one commit.
func TestStream_QoS1AppendTakesLingeringQoS0Along(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, LingerQoS0: MaxLinger}))
	s := st.Stream("s")
	type result struct {
		off uint64
		err error
	}
	appendOne(t, s, 1) // a commit now: the next QoS 0 append lingers
	before := commits(t, st)
	done := make(chan result, 2)
	r0 := rec("t", "qos0")
	r0.QoS = 0
	s.AppendAsync([]*Record{r0}, func(off uint64, err error) { done <- result{off, err} })
	s.AppendAsync([]*Record{rec("t", "qos1")}, func(off uint64, err error) { done <- result{off, err} })
	for want := uint64(1); want <= 2; want++ { // after the first append's offset 0
		r := <-done
		if r.err != nil || r.off != want {
			t.Fatalf("append: offset %d, %v; want offset %d", r.off, r.err, want)
		}
	}
	if n := commits(t, st) - before; n != 1 {
		t.Errorf("%d commits, want 1 (the QoS 0 append rides along)", n)
	}
}

func TestConfig_LingerBounds(t *testing.T) {
	for _, d := range []time.Duration{-time.Millisecond, MaxLinger + 1} {
		cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Linger: d})
		if err := cfg.Validate(); err == nil {
			t.Errorf("linger %v accepted", d)
		}
		cfg = testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, LingerQoS0: d})
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "qos0_linger") {
			t.Errorf("qos0_linger %v: %v, want an error naming qos0_linger", d, err)
		}
	}
}
