package mqtt

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// BenchmarkIngest_QoS1 measures PUBACKed QoS 1 publishes per second through
// the broker: 10 publishers, 16 in flight each, 128-byte payloads, no
// subscribers. "captured" goes through ingest onto an in-memory log that
// commits at once; "mochi" is a topic no stream captures, so mochi acks it
// itself: the ratio is ingest's overhead, without fsync.
func BenchmarkIngest_QoS1(b *testing.B) {
	for _, bc := range []struct{ name, topic string }{
		{"captured", "sensors/x"},
		{"mochi", "other/x"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := newMemLog(b, "default=sensors/#")
			br := newTestBroker(b, l)
			const pubs, window = 10, 16
			payload := bytes.Repeat([]byte("x"), 128)
			conns := make([]net.Conn, pubs)
			for i := range conns {
				conns[i] = dialRaw(b, br, "bench-"+string(rune('a'+i)), 4).Conn()
			}
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for i, conn := range conns {
				n := b.N / pubs
				if i < b.N%pubs {
					n++
				}
				wg.Add(1)
				go func(conn net.Conn, n int) {
					defer wg.Done()
					benchPublisher(b, conn, bc.topic, payload, n, window)
				}(conn, n)
			}
			wg.Wait()
		})
	}
}

// benchPublisher publishes n QoS 1 messages keeping window unacked.
func benchPublisher(b *testing.B, conn net.Conn, topic string, payload []byte, n, window int) {
	credits := make(chan struct{}, window)
	for range window {
		credits <- struct{}{}
	}
	readDone := make(chan error, 1)
	go func() {
		r := bufio.NewReader(conn)
		hdr := make([]byte, 4)
		for acked := 0; acked < n; acked++ {
			if _, err := io.ReadFull(r, hdr); err != nil { // PUBACK: 0x40 0x02 id id
				readDone <- err
				return
			}
			credits <- struct{}{}
		}
		readDone <- nil
	}()
	var buf bytes.Buffer
	for i := 0; i < n; i++ {
		<-credits
		buf.Reset()
		pk := packets.Packet{
			FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: 1},
			ProtocolVersion: 4,
			TopicName:       topic,
			PacketID:        uint16(i%60000 + 1),
			Payload:         payload,
		}
		if err := pk.PublishEncode(&buf); err != nil {
			b.Error(err)
			return
		}
		if _, err := conn.Write(buf.Bytes()); err != nil {
			b.Error(err)
			return
		}
	}
	if err := <-readDone; err != nil {
		b.Error(err)
	}
}
