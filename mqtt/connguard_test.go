package mqtt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// dialTCP opens a bare TCP connection to b, closed at cleanup.
func dialTCP(tb testing.TB, b *Broker) net.Conn {
	tb.Helper()
	conn, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// readUntilClosed returns what the broker sent on conn until it closed
// it; it fails if the connection is still open after waitLimit.
func readUntilClosed(tb testing.TB, conn net.Conn) []byte {
	tb.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(waitLimit))
	var got bytes.Buffer
	_, err := io.Copy(&got, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		tb.Fatalf("connection still open after %v (got %x)", waitLimit, got.Bytes())
	}
	return got.Bytes() // io.EOF (nil here) or a reset: closed either way
}

// expectBareClose fails unless the broker closes c's connection without
// sending a packet (an MQTT 3.1.1 client refused for a protocol error).
func expectBareClose(tb testing.TB, c *mqtttest.Raw) {
	tb.Helper()
	pk, err := c.Next()
	var ne net.Error
	switch {
	case err == nil:
		tb.Fatalf("got packet type %d, want the connection closed", pk.FixedHeader.Type)
	case errors.As(err, &ne) && ne.Timeout():
		tb.Fatalf("connection still open after %v", mqtttest.ReadTimeout)
	}
}

// connectHead is the start of a CONNECT announcing remaining bytes: fixed
// header, protocol name and level, then nothing more. MQTT's variable byte
// integer is Go's uvarint (7 bits a byte, least significant first).
func connectHead(version byte, remaining int) []byte {
	b := append([]byte{0x10}, binary.AppendUvarint(nil, uint64(remaining))...)
	return append(b, 0, 4, 'M', 'Q', 'T', 'T', version)
}

// publishBytes is a PUBLISH as a client would write it, with the topic
// name taken byte for byte.
func publishBytes(version byte, topic string, qos byte, id uint16, payload string) []byte {
	var body []byte
	body = append(body, byte(len(topic)>>8), byte(len(topic)))
	body = append(body, topic...)
	if qos > 0 {
		body = append(body, byte(id>>8), byte(id))
	}
	if version == 5 {
		body = append(body, 0) // no properties
	}
	body = append(body, payload...)
	out := append([]byte{packets.Publish<<4 | qos<<1}, binary.AppendUvarint(nil, uint64(len(body)))...)
	return append(out, body...)
}

// decodeFirst decodes the first packet of b, an MQTT 5 server's bytes.
func decodeFirst(tb testing.TB, b []byte) packets.Packet {
	tb.Helper()
	pk := packets.Packet{ProtocolVersion: 5}
	if len(b) < 2 {
		tb.Fatalf("got %x, want a packet", b)
	}
	if err := pk.FixedHeader.Decode(b[0]); err != nil {
		tb.Fatal(err)
	}
	n, used, err := packets.DecodeLength(bytes.NewReader(b[1:]))
	if err != nil || 1+used+n > len(b) {
		tb.Fatalf("packet %x: length %d: %v", b, n, err)
	}
	body := b[1+used : 1+used+n]
	switch pk.FixedHeader.Type {
	case packets.Connack:
		err = pk.ConnackDecode(body)
	case packets.Disconnect:
		err = pk.DisconnectDecode(body)
	default:
		tb.Fatalf("got packet type %d, want CONNACK or DISCONNECT", pk.FixedHeader.Type)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return pk
}

func TestGuard_ConnectTimeout(t *testing.T) {
	m := NewMetrics(nil)
	b := newTestBroker(t, newMemLog(t, "default=#"), func(c *Config) {
		c.ConnectTimeout = 100 * time.Millisecond
		c.Metrics = m
	})

	t.Run("silent connection is closed", func(t *testing.T) {
		conn := dialTCP(t, b)
		if got := readUntilClosed(t, conn); len(got) != 0 {
			t.Fatalf("broker sent %x to a connection that sent nothing", got)
		}
	})
	t.Run("connection that sends half a CONNECT is closed", func(t *testing.T) {
		conn := dialTCP(t, b)
		if _, err := conn.Write(connectHead(4, 40)); err != nil {
			t.Fatal(err)
		}
		readUntilClosed(t, conn)
	})
	if got := metricValue(m.Closed.WithLabelValues(ReasonConnectTimeout)); got != 2 {
		t.Fatalf("closed{connect_timeout} = %v, want 2", got)
	}
	t.Run("connected client outlives the CONNECT deadline", func(t *testing.T) {
		c := dialRaw(t, b, "patient", 4)
		time.Sleep(3 * b.cfg.ConnectTimeout) // not a timing assertion: gives a kept deadline time to fire
		c.Ping()
		expectPacket(t, c, packets.Pingresp, 0)
	})
}

func TestGuard_ConnectTooLarge(t *testing.T) {
	m := NewMetrics(nil)
	b := newTestBroker(t, newMemLog(t, "default=#"), func(c *Config) {
		c.ConnectTimeout = time.Hour // only the size may close these
		c.Metrics = m
	})
	const announced = 1 << 20 // mochi would allocate this before reading on

	t.Run("MQTT 5 gets CONNACK 0x95", func(t *testing.T) {
		conn := dialTCP(t, b)
		if _, err := conn.Write(connectHead(5, announced)); err != nil {
			t.Fatal(err)
		}
		pk := decodeFirst(t, readUntilClosed(t, conn))
		if pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != packets.ErrPacketTooLarge.Code {
			t.Fatalf("got type %d reason %#x, want CONNACK 0x95", pk.FixedHeader.Type, pk.ReasonCode)
		}
	})
	t.Run("MQTT 3.1.1 is closed", func(t *testing.T) {
		conn := dialTCP(t, b)
		if _, err := conn.Write(connectHead(4, announced)); err != nil {
			t.Fatal(err)
		}
		if got := readUntilClosed(t, conn); len(got) != 0 {
			t.Fatalf("broker sent %x, want a bare close", got)
		}
	})
	t.Run("header alone is closed", func(t *testing.T) {
		conn := dialTCP(t, b)
		if _, err := conn.Write(append([]byte{0x10}, binary.AppendUvarint(nil, uint64(announced))...)); err != nil {
			t.Fatal(err)
		}
		readUntilClosed(t, conn)
	})
	if got := metricValue(m.Closed.WithLabelValues(ReasonConnectTooLarge)); got != 3 {
		t.Fatalf("closed{connect_too_large} = %v, want 3", got)
	}
	t.Run("CONNECT within the limit is served", func(t *testing.T) {
		dialRaw(t, b, "normal", 5)
	})
}

func TestGuard_PendingConnectionsBounded(t *testing.T) {
	m := NewMetrics(nil)
	b := newTestBroker(t, newMemLog(t, "default=#"), func(c *Config) {
		c.ConnectTimeout = time.Hour
		c.MaxPendingConnections = 2
		c.Metrics = m
	})
	gl := b.mu.listeners[0]
	silent1 := dialTCP(t, b)
	dialTCP(t, b)
	testwait.Eventually(t, "two pending connections", func() bool { return gl.pending() == 2 })

	excess := dialTCP(t, b)
	readUntilClosed(t, excess)
	if got := metricValue(m.Closed.WithLabelValues(ReasonTooManyPending)); got != 1 {
		t.Fatalf("closed{too_many_pending} = %v, want 1", got)
	}

	_ = silent1.Close()
	testwait.Eventually(t, "one pending connection", func() bool { return gl.pending() == 1 })
	c := dialRaw(t, b, "normal", 4) // takes the free place until its CONNACK
	if n := gl.pending(); n != 1 {
		t.Fatalf("%d pending after the CONNACK, want 1 (the CONNACK frees a place)", n)
	}
	c.Ping()
	expectPacket(t, c, packets.Pingresp, 0)
}

func TestGuard_PublishTopicRefused(t *testing.T) {
	cases := []struct {
		name, topic string
		code        byte // MQTT 5 DISCONNECT reason
		reason      string
	}{
		{"plus", "sensors/+/t", packets.ErrTopicNameInvalid.Code, ReasonTopicInvalid},
		{"hash", "sensors/#", packets.ErrTopicNameInvalid.Code, ReasonTopicInvalid},
		{"invalid UTF-8", "sensors/\xff\xfe", packets.ErrMalformedPacket.Code, ReasonMalformed},
		{"truncated UTF-8", "sensors/\xe2\x82", packets.ErrMalformedPacket.Code, ReasonMalformed},
		{"U+0000", "sensors/\x00", packets.ErrMalformedPacket.Code, ReasonMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newMemLog(t, "default=#")
			m := NewMetrics(nil)
			b := newTestBroker(t, l, func(c *Config) { c.Metrics = m })

			v5 := dialRaw(t, b, "v5", 5)
			v5.WriteBytes(publishBytes(5, tc.topic, 1, 7, "x"))
			expectPacket(t, v5, packets.Disconnect, tc.code)
			expectClosed(t, v5)

			v3 := dialRaw(t, b, "v3", 4)
			v3.WriteBytes(publishBytes(4, tc.topic, 1, 7, "x"))
			expectBareClose(t, v3)
			if got := metricValue(m.Closed.WithLabelValues(tc.reason)); got != 2 {
				t.Fatalf("closed{%s} = %v, want 2", tc.reason, got)
			}
			if n := l.stream(t, "default").submitted(); n != 0 {
				t.Fatalf("%d appends, want none", n)
			}
		})
	}
}

func TestGuard_PacketTooLarge(t *testing.T) {
	l := newMemLog(t, "stored=sensors/#")
	m := NewMetrics(nil)
	b := newTestBroker(t, l, func(c *Config) { c.MaxPayload = 1000; c.Metrics = m })
	limit := int(maxPacketSize(1000))
	huge := append([]byte{packets.Publish << 4}, binary.AppendUvarint(nil, uint64(limit))...) // with its header, one byte above

	t.Run("MQTT 5 gets DISCONNECT 0x95 after the packets before it", func(t *testing.T) {
		c := dialRaw(t, b, "v5", 5)
		// One write: a QoS 1 publish mochi acks itself (no stream captures
		// it), then the oversized header. The PUBACK comes first.
		c.WriteBytes(append(publishBytes(5, "other/t", 1, 9, "ok"), append(huge, "abc"...)...))
		if pk := expectPacket(t, c, packets.Puback, 0); pk.PacketID != 9 {
			t.Fatalf("PUBACK for %d, want 9", pk.PacketID)
		}
		expectPacket(t, c, packets.Disconnect, packets.ErrPacketTooLarge.Code)
		expectClosed(t, c)
	})
	t.Run("MQTT 3.1.1 is closed", func(t *testing.T) {
		c := dialRaw(t, b, "v3", 4)
		c.WriteBytes(append(huge, "abc"...))
		expectBareClose(t, c)
	})
	if got := metricValue(m.Closed.WithLabelValues(ReasonPacketTooLarge)); got != 2 {
		t.Fatalf("closed{packet_too_large} = %v, want 2", got)
	}
	t.Run("packet at the limit is served", func(t *testing.T) {
		c := dialRaw(t, b, "big", 5)
		c.Publish("sensors/big", 1, 1, string(make([]byte, 1000)))
		expectPacket(t, c, packets.Puback, 0)
	})
}

func TestGuard_CloseEndsPendingConnections(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.ConnectTimeout = time.Hour
	b, err := New(cfg, newMemLog(t, "default=#"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	silent := dialTCP(t, b)
	testwait.Eventually(t, "a pending connection", func() bool { return b.mu.listeners[0].pending() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatalf("Close with a connection awaiting its CONNECT: %v", err)
	}
	readUntilClosed(t, silent)
}

// flakyListener fails its first Accept as a process out of file
// descriptors does.
type flakyListener struct {
	net.Listener
	failed atomic.Bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.failed.CompareAndSwap(false, true) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

func TestGuard_AcceptRetriesWhenOutOfFiles(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl := newGuardListener("t", &flakyListener{Listener: ln}, guardConfig{
		connectTimeout: time.Hour, maxConnect: 1 << 10, maxPacket: 1 << 10, maxPending: 8, maxPendingSrc: 8,
	}, NewMetrics(nil), newConnLog(slog.New(slog.DiscardHandler)))
	served := make(chan struct{}, 1)
	go gl.Serve(func(_ string, c net.Conn) error {
		served <- struct{}{}
		return c.Close()
	})
	t.Cleanup(func() { gl.Close(func(string) {}); gl.wait() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	select {
	case <-served:
	case <-time.After(waitLimit):
		t.Fatal("no connection served after a failed Accept")
	}
}
