package mqtt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// frameStream is a client's bytes: CONNECT, PUBLISHes with multi-byte
// UTF-8 topics, a PINGREQ and a DISCONNECT.
func frameStream(tb testing.TB) []byte {
	tb.Helper()
	var buf bytes.Buffer
	conn := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 5,
		Connect:         packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: "framer", Clean: true},
	}
	if err := conn.ConnectEncode(&buf); err != nil {
		tb.Fatal(err)
	}
	buf.Write(publishBytes(5, "sensors/température/€", 1, 1, "payload"))
	buf.Write(publishBytes(5, "a", 0, 0, string(make([]byte, 300))))
	buf.Write([]byte{packets.Pingreq << 4, 0})
	buf.Write(publishBytes(5, "日本/語", 2, 2, ""))
	buf.Write([]byte{packets.Disconnect << 4, 0})
	return buf.Bytes()
}

// scanChunks feeds b to a fresh framer in chunks of size n. On a refusal
// it returns where the refused packet starts in b, -1 if it started in an
// earlier chunk than the one refused.
func scanChunks(b []byte, n int) (*framer, int, *refusal) {
	f := &framer{maxConnect: 1 << 10, maxPacket: 1 << 10}
	for off := 0; off < len(b); off += n {
		end := min(off+n, len(b))
		if start, ref := f.scan(b[off:end]); ref != nil {
			if start < 0 {
				return f, -1, ref
			}
			return f, off + start, ref
		}
	}
	return f, 0, nil
}

func TestFramer_FollowsPacketsAcrossAnyChunking(t *testing.T) {
	stream := frameStream(t)
	for n := 1; n <= len(stream); n++ {
		f, _, ref := scanChunks(stream, n)
		if ref != nil {
			t.Fatalf("chunks of %d: refused %v", n, ref.err)
		}
		if f.seen != 6 || f.st != stType || f.version != 5 {
			t.Fatalf("chunks of %d: %d packets, state %d, version %d; want 6, between packets, 5", n, f.seen, f.st, f.version)
		}
	}
}

func TestFramer_RefusesWhereThePacketStarts(t *testing.T) {
	good := frameStream(t)
	good = good[:len(good)-2] // without the DISCONNECT
	bad := publishBytes(5, "x/\xc3(", 0, 0, "")
	stream := append(append([]byte(nil), good...), bad...)
	for n := 1; n <= len(stream); n++ {
		_, at, ref := scanChunks(stream, n)
		if ref == nil || !errors.Is(ref.err, ErrMalformed) {
			t.Fatalf("chunks of %d: refusal %v, want ErrMalformed", n, ref)
		}
		// The guard hands mochi the bytes before the refused packet and
		// no byte of it after the chunk it starts in.
		refusedChunk := (len(stream) - 2) / n * n // the bad byte is the last but one (a property length follows)
		startChunk := len(good) / n * n
		switch {
		case at >= 0 && at != len(good):
			t.Fatalf("chunks of %d: refused packet at %d, want %d", n, at, len(good))
		case at < 0 && startChunk == refusedChunk:
			t.Fatalf("chunks of %d: refused packet said to start in an earlier chunk", n)
		}
	}
}

func FuzzFramer(f *testing.F) {
	f.Add(frameStream(f), uint8(7))
	f.Add(publishBytes(5, "a/+", 1, 1, "x"), uint8(1))
	f.Add(append([]byte{0x10}, binary.AppendUvarint(nil, 1<<20)...), uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		// Any bytes, any chunking: no panic, and the same verdict as one chunk.
		_, _, whole := scanChunks(b, max(len(b), 1))
		_, _, chunked := scanChunks(b, int(n)+1)
		if (whole == nil) != (chunked == nil) || (whole != nil && whole.reason != chunked.reason) {
			t.Fatalf("one chunk: %v; chunks of %d: %v", whole, int(n)+1, chunked)
		}
	})
}

// BenchmarkFramer_Scan is the guard's cost on a publisher's bytes: 2 KiB
// reads (the default buffer_bytes) of QoS 1 publishes with a 24-byte topic
// and a 128-byte payload.
func BenchmarkFramer_Scan(b *testing.B) {
	pub := publishBytes(4, "sensors/greenhouse-3/temp", 1, 1, string(make([]byte, 128)))
	var chunk []byte
	for len(chunk)+len(pub) <= 2048 {
		chunk = append(chunk, pub...)
	}
	perChunk := len(chunk) / len(pub)
	f := &framer{maxConnect: 1 << 16, maxPacket: 1 << 20, seen: 1}
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ref := f.scan(chunk); ref != nil {
			b.Fatal(ref.err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perChunk), "ns/packet")
}
