package logstore

import (
	"fmt"
	"testing"
	"time"
)

// How long appends wait under a linger. These were timed assertions in
// linger_test.go; on a shared machine a stall fails them, so they are
// measured here instead (ns/op is the latency of the append measured,
// setup excluded):
//
//	go test -run '^$' -bench 'Linger' -benchtime 20x ./logstore/
//
// What to expect: QuietAppend and the *Ends* benchmarks take about one
// commit (well under their linger); AfterCommit takes about the linger.

const benchLinger = 50 * time.Millisecond

func lingerStore(b *testing.B, sc StreamConfig) (*Store, *Stream) {
	b.Helper()
	sc.Name, sc.Filters = "s", []string{"#"}
	st := openStore(b, testConfig(b, sc))
	return st, st.Stream("s")
}

// An append to a stream that has not committed for a linger: no wait.
func BenchmarkLinger_QuietAppend(b *testing.B) {
	_, s := lingerStore(b, StreamConfig{Linger: benchLinger})
	for range b.N {
		b.StopTimer()
		time.Sleep(benchLinger)
		b.StartTimer()
		appendOne(b, s, 1)
	}
}

// An append right after a commit: it waits for the rest of the linger.
func BenchmarkLinger_AppendAfterCommit(b *testing.B) {
	_, s := lingerStore(b, StreamConfig{Linger: benchLinger})
	for range b.N {
		b.StopTimer()
		time.Sleep(benchLinger)
		appendOne(b, s, 1)
		b.StartTimer()
		appendOne(b, s, 1)
	}
}

// A full batch right after a commit does not wait out the linger.
func BenchmarkLinger_FullBatchEndsIt(b *testing.B) {
	_, s := lingerStore(b, StreamConfig{Linger: MaxLinger})
	recs := make([]*Record, maxBatchRecords)
	for i := range recs {
		recs[i] = rec("t", "x")
	}
	for range b.N {
		b.StopTimer()
		appendOne(b, s, 1)
		b.StartTimer()
		done := make(chan error, 1)
		s.AppendAsync(recs, func(_ uint64, err error) { done <- err })
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}

// Close with an append lingering does not wait out the linger.
func BenchmarkLinger_CloseEndsIt(b *testing.B) {
	for range b.N {
		b.StopTimer()
		st, err := Open(testConfig(b, StreamConfig{Name: "s", Filters: []string{"#"}, Linger: MaxLinger}))
		if err != nil {
			b.Fatal(err)
		}
		appendOne(b, st.Stream("s"), 1)
		st.Stream("s").AppendAsync([]*Record{rec("t", "x")}, func(uint64, error) {})
		b.StartTimer()
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// A QoS 1 append behind a lingering QoS 0 one commits at once.
func BenchmarkLinger_QoS1EndsAQoS0Linger(b *testing.B) {
	_, s := lingerStore(b, StreamConfig{LingerQoS0: MaxLinger})
	r0 := rec("t", "qos0")
	r0.QoS = 0
	for range b.N {
		b.StopTimer()
		appendOne(b, s, 1)
		s.AppendAsync([]*Record{r0}, func(uint64, error) {})
		b.StartTimer()
		appendOne(b, s, 1)
	}
}

// QoS 0 appends that fill a batch one by one end their linger.
func BenchmarkLinger_QoS0FullBatchEndsIt(b *testing.B) {
	_, s := lingerStore(b, StreamConfig{LingerQoS0: MaxLinger})
	for range b.N {
		b.StopTimer()
		appendOne(b, s, 1)
		done := make(chan error, maxBatchRecords)
		b.StartTimer()
		for i := range maxBatchRecords {
			r := rec("t", fmt.Sprint(i))
			r.QoS = 0
			s.AppendAsync([]*Record{r}, func(_ uint64, err error) { done <- err })
		}
		for range maxBatchRecords {
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
	}
}

// Commits per append for appends 5 ms apart, with and without a linger
// (commits/append: 1 means each committed alone).
func BenchmarkLinger_SpacedAppends(b *testing.B) {
	for _, tc := range []struct {
		name string
		sc   StreamConfig
		qos  byte
	}{
		{"none", StreamConfig{}, 1},
		{"linger=500ms", StreamConfig{Linger: 500 * time.Millisecond}, 1},
		{"qos0_linger=500ms/qos1", StreamConfig{LingerQoS0: 500 * time.Millisecond}, 1},
		{"qos0_linger=500ms/qos0", StreamConfig{LingerQoS0: 500 * time.Millisecond}, 0},
	} {
		b.Run(tc.name, func(b *testing.B) {
			st, s := lingerStore(b, tc.sc)
			before := commits(b, st)
			for range b.N {
				appendSpacedQoS(b, s, 5, 5*time.Millisecond, tc.qos)
			}
			b.ReportMetric(float64(commits(b, st)-before)/float64(5*b.N), "commits/append")
		})
	}
}
