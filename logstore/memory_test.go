package logstore

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// The live Go heap a store holds while records pile up is what a broker's
// RSS rests on through an upstream outage: it must not grow with
// the records, and it must be small, since Go's GC lets garbage grow to
// twice it before collecting (profile.go, flatRSS). Badger's memtable
// arena was most of it: 21 MB for the old 16 MiB memtables, about 5 MB
// for 4 MiB, 2.6 for 2 MiB. No timing: at each checkpoint the test collects until the live
// heap is under the bound (a memtable being flushed, or a compaction, may
// hold a second arena or a table builder for a moment), and fails only if
// it never gets there.
func TestProfile_LiveHeapStaysSmallAsRecordsPileUp(t *testing.T) {
	const (
		bound       = 12 * mib // above the heap before Open
		checkpoints = 4
		per         = 100_000 // records between checkpoints
	)
	for _, p := range []Profile{ProfilePi, ProfileServer} {
		t.Run(string(p), func(t *testing.T) {
			cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: DurabilityInterval})
			cfg.Profile = p
			base := liveHeap()
			st := openStore(t, cfg)
			s := st.Stream("s")
			payload := make([]byte, 64)
			for c := 1; c <= checkpoints; c++ {
				for i := 0; i < per; i += 1000 {
					recs := make([]*Record, 1000)
					for j := range recs {
						recs[j] = &Record{Topic: "sensors/a/temp", Payload: payload, QoS: 1}
					}
					if _, err := s.Append(context.Background(), recs...); err != nil {
						t.Fatal(err)
					}
				}
				got := int64(0)
				deadline := time.Now().Add(30 * time.Second)
				for {
					got = int64(liveHeap()) - int64(base)
					if got <= bound || time.Now().After(deadline) {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				if got > bound {
					t.Fatalf("after %d records the live heap is %.1f MiB above the heap before Open, want at most %d MiB",
						c*per, float64(got)/mib, bound/mib)
				}
				t.Logf("after %d records: live heap %.1f MiB above the heap before Open", c*per, float64(got)/mib)
			}
		})
	}
}

// liveHeap is the heap's live bytes right after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
