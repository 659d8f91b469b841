package logstore

import (
	"context"
	"math/rand/v2"
	"testing"
)

const benchPayload = 128

func benchStore(b *testing.B, d Durability) *Stream {
	b.Helper()
	cfg := testConfig(b, StreamConfig{Name: "bench", Filters: []string{"#"}, Durability: d})
	cfg.Profile = DefaultProfile()
	return openStore(b, cfg).Stream("bench")
}

// benchAppend runs one-record appends from 64 goroutines (32 per core on 2
// cores), so the appender batches them: throughput of group commit.
func benchAppend(b *testing.B, d Durability) {
	benchAppendOn(b, benchStore(b, d))
}

func benchAppendOn(b *testing.B, s *Stream) {
	payload := make([]byte, benchPayload)
	b.SetBytes(benchPayload)
	b.ReportAllocs()
	b.SetParallelism(max(1, 64/max(1, testingProcs())))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := &Record{Topic: "sensors/bench/temp", Payload: payload, QoS: 1, ClientID: "bench"}
			if _, err := s.Append(context.Background(), r); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rec/s")
}

func BenchmarkAppend(b *testing.B)         { benchAppend(b, DurabilityFsync) }
func BenchmarkAppendInterval(b *testing.B) { benchAppend(b, DurabilityInterval) }

// BenchmarkReadFrom reads 500 records from a random offset of a 100k-record
// stream: the cost of a consumer seek plus a page.
func BenchmarkReadFrom(b *testing.B) {
	s := benchStore(b, DurabilityInterval)
	const total, page = 100_000, 500
	payload := make([]byte, benchPayload)
	for i := 0; i < total; i += 1000 {
		recs := make([]*Record, 1000)
		for j := range recs {
			recs[j] = &Record{Topic: "sensors/bench/temp", Payload: payload, QoS: 1, ClientID: "bench"}
		}
		if _, err := s.Append(context.Background(), recs...); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(page * benchPayload)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		from := rand.Uint64N(total - page)
		recs, err := s.Read(from, page, 0)
		if err != nil || len(recs) != page {
			b.Fatalf("Read(%d) = %d records, %v", from, len(recs), err)
		}
	}
	b.ReportMetric(float64(b.N)*page/b.Elapsed().Seconds(), "rec/s")
}

// BenchmarkAppendBatch100 appends 100 records per call from one goroutine
// (fsync): the raw write path without waiting producers.
func BenchmarkAppendBatch100(b *testing.B) {
	s := benchStore(b, DurabilityFsync)
	payload := make([]byte, benchPayload)
	b.SetBytes(100 * benchPayload)
	b.ReportAllocs()
	for b.Loop() {
		recs := make([]*Record, 100)
		for j := range recs {
			recs[j] = &Record{Topic: "sensors/bench/temp", Payload: payload, QoS: 1, ClientID: "bench"}
		}
		if _, err := s.Append(context.Background(), recs...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*100/b.Elapsed().Seconds(), "rec/s")
}
