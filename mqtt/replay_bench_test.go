package mqtt

import (
	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

var (
	replayBenchProfile = flag.String("replay.profile", string(logstore.ProfileServer),
		"BenchmarkReplay: the log's storage profile")
	replayBenchCPU = flag.String("replay.cpuprofile", "",
		"BenchmarkReplay: write a CPU profile of the replay alone (not the fill) to this file, suffixed with the sub-benchmark")
)

// storeLog is a logstore.Store as the broker sees it (edge has the same
// adapter; mqtt cannot import edge).
type storeLog struct{ s *logstore.Store }

func (l storeLog) Route(topic string) Stream {
	if s := l.s.Route(topic); s != nil {
		return s
	}
	return nil
}
func (l storeLog) State() StateStore { return l.s }
func (l storeLog) Stream(name string) Stream {
	if s := l.s.Stream(name); s != nil {
		return s
	}
	return nil
}
func (l storeLog) WatchStreams() (<-chan StreamEvent, func()) {
	in, cancel := l.s.Watch()
	return ForwardStreamEvents(in, cancel, func(ev logstore.StreamEvent) StreamEvent {
		return StreamEvent{Kind: ev.Kind, Stream: ev.Stream}
	})
}
func (l storeLog) Streams() []Stream {
	var out []Stream
	for _, s := range l.s.Streams() {
		out = append(out, s)
	}
	return out
}

// BenchmarkReplay measures a replay through $replay/earliest/+/bench/#
// from a Badger log on disk holding b.N records of 128 bytes, to one raw
// consumer in the same process: MQTT 5 at QoS 0, at QoS 1 with a Receive
// Maximum of 100, and MQTT 3.1.1 at QoS 0 (no user properties). The fill is
// not timed. For a profile (the client's own reading shows up in it as
// readReplay):
//
//	go test -run '^$' -bench 'Replay/QoS0-v5' -benchtime 1000000x ./mqtt/ -replay.cpuprofile /tmp/replay.cpu
//	go tool pprof -top /tmp/replay.cpu-QoS0-v5
func BenchmarkReplay(b *testing.B) {
	for _, bc := range []struct {
		name         string
		qos, version byte
	}{
		{"QoS0-v5", 0, 5}, {"QoS1-v5-window100", 1, 5}, {"QoS0-v3", 0, 4},
	} {
		b.Run(bc.name, func(b *testing.B) { benchReplay(b, bc.name, bc.qos, bc.version) })
	}
}

func benchReplay(b *testing.B, name string, qos, version byte) {
	cfg := logstore.Config{
		Dir:          b.TempDir(),
		Profile:      logstore.Profile(*replayBenchProfile),
		Streams:      []logstore.StreamConfig{{Name: "default", Filters: []string{"#"}, Durability: logstore.DurabilityInterval}},
		MinFreeBytes: -1,
	}
	st, err := logstore.Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	fillBenchLog(b, st.Stream("default"), b.N)
	// Reopen, as a restarted broker would: Badger flushes its memtables on
	// Close, so the replay does not share the CPU with the fill's flushes,
	// and its caches start empty.
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	if st, err = logstore.Open(cfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	br := newTestBroker(b, storeLog{st}, func(c *Config) { c.Window, c.SendWindow = 100, 100 })

	raw := mqtttest.Dial(b, br.Addr().String(), mqtttest.Connect{ClientID: "replay-bench", Version: version, Clean: true,
		Properties: packets.Properties{ReceiveMaximum: 100}})
	conn := raw.Conn()
	r := bufio.NewReaderSize(conn, 256<<10)
	w := bufio.NewWriterSize(conn, 4<<10)

	if *replayBenchCPU != "" {
		f, err := os.Create(*replayBenchCPU + "-" + name)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	b.SetBytes(128)
	b.ResetTimer()
	raw.Write(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		PacketID:    1,
		Filters:     packets.Subscriptions{{Filter: "$replay/earliest/+/bench/#", Qos: qos}},
	})
	last, err := readReplay(r, w, b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if want := fmt.Sprintf("$replay/earliest/%d/", b.N-1); !strings.HasPrefix(last, want) {
		b.Fatalf("last delivery on %q, want %s...", last, want)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
}

// fillBenchLog appends n records of 128 random bytes (incompressible, like
// peat-bench's fill) on bench/replay/<i%16>.
func fillBenchLog(tb testing.TB, s *logstore.Stream, n int) {
	tb.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Now().UnixMilli()
	for i := 0; i < n; {
		batch := make([]*logstore.Record, 0, min(1000, n-i))
		for ; i < n && len(batch) < cap(batch); i++ {
			payload := make([]byte, 128)
			for b := 0; b < len(payload); b += 8 {
				binary.LittleEndian.PutUint64(payload[b:], rng.Uint64())
			}
			batch = append(batch, &logstore.Record{Topic: fmt.Sprintf("bench/replay/%d", i%16), Payload: payload,
				QoS: 1, Timestamp: now, ClientID: "bench"})
		}
		if _, err := s.Append(context.Background(), batch...); err != nil {
			tb.Fatal(err)
		}
	}
}

// readReplay reads the SUBACK and then n PUBLISHes, acknowledging QoS 1
// ones, and returns the last one's topic.
func readReplay(r *bufio.Reader, w *bufio.Writer, n int) (string, error) {
	var body []byte
	var last []byte
	ack := []byte{packets.Puback << 4, 2, 0, 0}
	for got := 0; got < n; {
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return "", err
			}
		}
		hb, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		size, _, err := packets.DecodeLength(r)
		if err != nil {
			return "", err
		}
		if cap(body) < size {
			body = make([]byte, size)
		}
		body = body[:size]
		if _, err := io.ReadFull(r, body); err != nil {
			return "", err
		}
		switch hb >> 4 {
		case packets.Suback:
			if code := body[len(body)-1]; code >= 0x80 {
				return "", fmt.Errorf("subscription refused: %#x", code)
			}
			continue
		case packets.Publish:
		default:
			continue
		}
		got++
		tl := int(binary.BigEndian.Uint16(body))
		last = body[2 : 2+tl]
		if (hb>>1)&3 > 0 {
			copy(ack[2:], body[2+tl:2+tl+2])
			_, _ = w.Write(ack)
		}
	}
	return string(last), w.Flush()
}
