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

func TestStream_LingerSharesCommitsAmongLoneAppends(t *testing.T) {
	for _, d := range []Durability{DurabilityFsync, DurabilityInterval} {
		t.Run(string(d), func(t *testing.T) {
			// Five publishes 5 ms apart: without a linger each is its own
			// commit (and fsync); with a linger longer than all five, the
			// first (the stream was quiet) commits at once and the other
			// four share the next commit.
			without := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: d}))
			appendSpaced(t, without.Stream("s"), 5, 5*time.Millisecond)
			if n := commits(t, without); n < 3 {
				t.Fatalf("without linger: %d commits for 5 spaced appends, want several (the test cannot tell otherwise)", n)
			}

			st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: d,
				Linger: 500 * time.Millisecond}))
			offs := appendSpaced(t, st.Stream("s"), 5, 5*time.Millisecond)
			if n := commits(t, st); n != 2 {
				t.Errorf("with a 500ms linger: %d commits for 5 appends 5 ms apart, want 2 (the first alone, then the rest)", n)
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

// Linger paces commits rather than delaying each append: an append that
// arrives when the stream has not committed for a linger commits at once,
// and one that arrives within a linger of the previous commit waits for
// the rest of it.
func TestStream_LingerDoesNotDelayAnAppendToAQuietStream(t *testing.T) {
	const linger = 400 * time.Millisecond
	st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Linger: linger}))
	s := st.Stream("s")
	timed := func() time.Duration {
		start := time.Now()
		appendSpaced(t, s, 1, 0)
		return time.Since(start)
	}
	if took := timed(); took >= linger/2 {
		t.Errorf("the first append to a quiet stream took %v, want no linger", took)
	}
	if took := timed(); took < linger/2 {
		t.Errorf("an append right after a commit took %v, want it to wait for the rest of the %v linger", took, linger)
	}
	time.Sleep(linger)
	if took := timed(); took >= linger/2 {
		t.Errorf("an append a linger after the last commit took %v, want no linger", took)
	}
	if n := commits(t, st); n != 3 {
		t.Errorf("%d commits for 3 appends one after another, want 3", n)
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

// QoS 0 appends linger by their own setting: nobody waits for their
// acknowledgement, so by default they share commits that QoS 1 appends,
// whose publishers wait, do not.
func TestStream_QoS0LingerSharesCommitsAmongQoS0AppendsOnly(t *testing.T) {
	for _, d := range []Durability{DurabilityFsync, DurabilityInterval} {
		t.Run(string(d), func(t *testing.T) {
			const linger = 500 * time.Millisecond
			st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: d,
				LingerQoS0: linger}))
			s := st.Stream("s")
			appendSpacedQoS(t, s, 5, 5*time.Millisecond, 1)
			qos1 := commits(t, st)
			if qos1 < 3 {
				t.Fatalf("QoS 1: %d commits for 5 appends 5 ms apart, want several (QoS 1 must not linger)", qos1)
			}
			// The QoS 0 appends follow the last QoS 1 commit at once, so
			// they wait until a linger after it began.
			start := time.Now()
			offs := appendSpacedQoS(t, s, 5, 5*time.Millisecond, 0)
			if n := commits(t, st) - qos1; n != 1 {
				t.Errorf("QoS 0: %d commits for 5 appends 5 ms apart with a 500ms QoS 0 linger, want 1", n)
			}
			if took := time.Since(start); took < linger*4/5 {
				t.Errorf("QoS 0 appends done after %v, before their linger was over", took)
			}
			for i, off := range offs {
				if want := uint64(5 + i); off != want {
					t.Errorf("QoS 0 append %d got offset %d, want %d (arrival order)", i, off, want)
				}
			}
		})
	}
}

// A QoS 1 append does not wait out the QoS 0 appends' linger: it commits at
// once, and takes the QoS 0 appends queued before it along, in order.
func TestStream_QoS1AppendEndsAQoS0Linger(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, LingerQoS0: MaxLinger}))
	s := st.Stream("s")
	type result struct {
		off uint64
		err error
	}
	appendSpaced(t, s, 1, 0) // a commit now: the next QoS 0 append lingers
	before := commits(t, st)
	done := make(chan result, 2)
	r0 := rec("t", "qos0")
	r0.QoS = 0
	start := time.Now()
	s.AppendAsync([]*Record{r0}, func(off uint64, err error) { done <- result{off, err} })
	time.Sleep(10 * time.Millisecond)
	s.AppendAsync([]*Record{rec("t", "qos1")}, func(off uint64, err error) { done <- result{off, err} })
	for want := uint64(1); want <= 2; want++ { // after the first append's offset 0
		r := <-done
		if r.err != nil || r.off != want {
			t.Fatalf("append: offset %d, %v; want offset %d", r.off, r.err, want)
		}
	}
	if took := time.Since(start); took >= MaxLinger/2 {
		t.Errorf("a QoS 1 append behind a lingering QoS 0 one took %v", took)
	}
	if n := commits(t, st) - before; n != 1 {
		t.Errorf("%d commits, want 1 (the QoS 0 append rides along)", n)
	}
}

// QoS 0 appends that fill a batch one by one end the linger too: the
// append that fills it wakes the appender.
func TestStream_QoS0LingerEndsWithAFullBatch(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, LingerQoS0: MaxLinger}))
	s := st.Stream("s")
	appendSpaced(t, s, 1, 0) // a commit now: the QoS 0 appends linger
	done := make(chan error, maxBatchRecords)
	start := time.Now()
	for i := range maxBatchRecords {
		r := rec("t", fmt.Sprint(i))
		r.QoS = 0
		s.AppendAsync([]*Record{r}, func(_ uint64, err error) { done <- err })
	}
	for range maxBatchRecords {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took >= MaxLinger/2 {
		t.Errorf("%d QoS 0 appends, a full batch, took %v: they waited out the linger", maxBatchRecords, took)
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
