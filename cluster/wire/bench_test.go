package wire

import (
	"bytes"
	"testing"
)

// The hottest messages: a follower's fetch and the leader's answer, and
// a forwarded append.
func BenchmarkMessages(b *testing.B) {
	recs := make([][]byte, 64)
	for i := range recs {
		recs[i] = bytes.Repeat([]byte{byte(i)}, 200)
	}
	for _, bc := range []struct {
		name string
		m    message
	}{
		{"FetchRequest", &FetchRequest{"telemetry", "n2", 1733300000000, 7, 1 << 40, 1<<40 - 5, 1 << 20, 500}},
		{"FetchResponse", &FetchResponse{None, 7, 1 << 40, 3, 1<<40 + 64, 1 << 40, recs}},
		{"ProduceRequest", &ProduceRequest{"telemetry", "n2", 4, 17, recs[:8], nil}},
		{"ProduceResponse", &ProduceResponse{None, 17, 1 << 40, "", nil}},
	} {
		enc := bc.m.AppendTo(nil)
		b.Run(bc.name+"/Encode", func(b *testing.B) {
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			buf := make([]byte, 0, len(enc))
			for range b.N {
				buf = bc.m.AppendTo(buf[:0])
			}
		})
		b.Run(bc.name+"/Decode", func(b *testing.B) {
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for range b.N {
				if err := bc.m.Decode(enc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
