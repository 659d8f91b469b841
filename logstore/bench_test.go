package logstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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

// benchLog is a stream of n 128-byte records one millisecond apart, written
// with the given profile, then closed and reopened so that the records are
// read from Badger's tables (and value log), not from its memtable or the
// tail cache.
func benchLog(b *testing.B, p Profile, n int) *Stream {
	b.Helper()
	cfg := testConfig(b, StreamConfig{Name: "bench", Filters: []string{"#"}, Durability: DurabilityInterval})
	cfg.Profile = p
	st, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	s := st.Stream("bench")
	payload := make([]byte, benchPayload)
	ts := time.Now().Add(-time.Duration(n) * time.Millisecond).UnixMilli()
	for i := 0; i < n; i += 1000 {
		recs := make([]*Record, min(1000, n-i))
		for j := range recs {
			recs[j] = &Record{Topic: "sensors/bench/temp", Payload: payload, QoS: 1, ClientID: "bench", Timestamp: ts + int64(i+j)}
		}
		if _, err := s.Append(context.Background(), recs...); err != nil {
			b.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	return openStore(b, cfg).Stream("bench")
}

var benchProfiles = []Profile{ProfilePiZero, ProfilePi, ProfileServer}

// BenchmarkReadFrom reads 500 records from a random offset of a 100k-record
// stream: the cost of a consumer seek plus a page.
func BenchmarkReadFrom(b *testing.B) {
	for _, p := range benchProfiles {
		b.Run(string(p), func(b *testing.B) {
			const total, page = 100_000, 500
			s := benchLog(b, p, total)
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
		})
	}
}

// BenchmarkReadAll reads a 100k-record stream from offset 0 to its end in
// pages of 500, as a replay does.
func BenchmarkReadAll(b *testing.B) {
	for _, p := range benchProfiles {
		b.Run(string(p), func(b *testing.B) {
			const total, page = 100_000, 500
			s := benchLog(b, p, total)
			b.SetBytes(total * benchPayload)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for from := uint64(0); from < total; from += page {
					if recs, err := s.Read(from, page, 0); err != nil || len(recs) != page {
						b.Fatalf("Read(%d) = %d records, %v", from, len(recs), err)
					}
				}
			}
			b.ReportMetric(float64(b.N)*total/b.Elapsed().Seconds(), "rec/s")
		})
	}
}

// BenchmarkOffsetForTime finds the offset of a random time in a 100k-record
// stream (the sparse time index, then a scan of at most one chunk).
func BenchmarkOffsetForTime(b *testing.B) {
	for _, p := range benchProfiles {
		b.Run(string(p), func(b *testing.B) {
			const total = 100_000
			s := benchLog(b, p, total)
			first, err := s.Read(0, 1, 0)
			if err != nil {
				b.Fatal(err)
			}
			t0 := first[0].Timestamp
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				want := rand.Uint64N(total)
				if got, err := s.OffsetForTime(time.UnixMilli(t0 + int64(want))); err != nil || got != want {
					b.Fatalf("OffsetForTime = %d, %v; want %d", got, err, want)
				}
			}
		})
	}
}

// BenchmarkAppendOneAtATime appends from one goroutine that waits for
// each append, so every append is a group commit of its own: what a commit
// costs with fsync (Badger's two msyncs) and without, for 1 and 25 records.
// Besides the wall time it reports the process's CPU time per commit
// (cpu-µs/op, unix). On one core, as the README's figure was taken:
//
//	taskset -c 0 go test -run '^$' -bench AppendOneAtATime -benchtime 5000x ./logstore
func BenchmarkAppendOneAtATime(b *testing.B) {
	for _, d := range []Durability{DurabilityFsync, DurabilityInterval} {
		for _, n := range []int{1, 25} {
			b.Run(fmt.Sprintf("%s/%d", d, n), func(b *testing.B) {
				s := benchStore(b, d)
				payload := make([]byte, benchPayload)
				cpu0 := processCPU()
				for b.Loop() {
					recs := make([]*Record, n)
					for i := range recs {
						recs[i] = &Record{Topic: "sensors/bench/temp", Payload: payload, QoS: 1, ClientID: "bench"}
					}
					if _, err := s.Append(context.Background(), recs...); err != nil {
						b.Fatal(err)
					}
				}
				if cpu0 >= 0 {
					b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
				}
			})
		}
	}
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

// BenchmarkIngest appends records of 16 from 10 goroutines with fsync
// durability (the broker's group commit under 10 publishers) and reports
// the bytes the process wrote per record (/proc/self/io write_bytes, Linux;
// put TMPDIR on the file system to measure: see scripts/bench-pi.sh on page
// sizes), with payloads of zeros, which Snappy shrinks, and of random bytes,
// which it does not. For a 1M-record run: -benchtime 6250x (x 160 records).
func BenchmarkIngest(b *testing.B) {
	for _, p := range benchProfiles {
		for _, random := range []bool{false, true} {
			name := string(p) + "/zeros"
			if random {
				name = string(p) + "/random"
			}
			b.Run(name, func(b *testing.B) {
				cfg := testConfig(b, StreamConfig{Name: "bench", Filters: []string{"#"}})
				cfg.Profile = p
				s := openStore(b, cfg).Stream("bench")
				const writers, per = 10, 16
				w0 := procWriteBytes()
				b.ResetTimer()
				var wg sync.WaitGroup
				for g := range writers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < b.N; i++ {
							recs := make([]*Record, per)
							for j := range recs {
								pl := make([]byte, benchPayload)
								if random {
									fillRandom(pl, uint64(g)<<40|uint64(i*per+j))
								}
								recs[j] = &Record{Topic: "sensors/bench/temp", Payload: pl, QoS: 1, ClientID: "bench"}
							}
							if _, err := s.Append(context.Background(), recs...); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				n := float64(b.N * writers * per)
				b.ReportMetric(n/b.Elapsed().Seconds(), "rec/s")
				if w0 >= 0 {
					b.ReportMetric(float64(procWriteBytes()-w0)/n, "written-B/rec")
				}
			})
		}
	}
}

// procWriteBytes is the process's write_bytes from /proc/self/io, or -1.
func procWriteBytes() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "write_bytes: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
