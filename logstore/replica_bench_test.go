package logstore

import (
	"context"
	"testing"
)

// BenchmarkReadRawAll reads a 100k-record stream from offset 0 to its end
// with ReadRaw in pages of 1000, as a leader serving a follower that starts
// from nothing: BenchmarkReadAll without the decode.
func BenchmarkReadRawAll(b *testing.B) {
	for _, p := range benchProfiles {
		b.Run(string(p), func(b *testing.B) {
			const total, page = 100_000, 1000
			s := benchLog(b, p, total)
			b.SetBytes(total * benchPayload)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for from := uint64(0); from < total; from += page {
					if vals, err := s.ReadRaw(from, page, 0); err != nil || len(vals) != page {
						b.Fatalf("ReadRaw(%d) = %d values, %v", from, len(vals), err)
					}
				}
			}
			b.ReportMetric(float64(b.N)*total/b.Elapsed().Seconds(), "rec/s")
		})
	}
}

// BenchmarkReplicate copies a 100k-record stream to a follower in process:
// ReadRaw from the leader, AppendReplica (checksums, one group commit per
// page, interval durability) on the follower. No network.
func BenchmarkReplicate(b *testing.B) {
	const total, page = 100_000, 1000
	leader := benchLog(b, ProfilePi, total)
	b.SetBytes(total * benchPayload)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		cfg := testConfig(b, StreamConfig{Name: "bench", Filters: []string{"#"}, Durability: DurabilityInterval})
		cfg.Profile = ProfilePi
		st, err := Open(cfg)
		if err != nil {
			b.Fatal(err)
		}
		follower := st.Stream("bench")
		b.StartTimer()
		for from := uint64(0); from < total; from += page {
			vals, err := leader.ReadRaw(from, page, 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := follower.AppendReplica(context.Background(), from, vals); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.N)*total/b.Elapsed().Seconds(), "rec/s")
}
