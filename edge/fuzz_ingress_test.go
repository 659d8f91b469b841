package edge

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// FuzzIngress sends a real node (Badger log, default config, anonymous on
// loopback) a valid CONNECT, MQTT 3.1.1 or 5, then the fuzzer's bytes, as
// one client would. Whatever the bytes, no panic may happen (none
// recovered either: peat_mqtt_panics_total stays 0), and the node closes
// the connection once the client stops sending. `make fuzz` runs it.
func FuzzIngress(f *testing.F) {
	for _, seed := range ingressSeeds() {
		f.Add(seed.v5, seed.b)
	}
	n := startNode(f, testConfig(f))
	addr := n.MQTTAddr().String()
	f.Fuzz(func(t *testing.T, v5 bool, b []byte) {
		conn := dialConnected(t, addr, v5)
		defer func() { _ = conn.Close() }()
		_, _ = conn.Write(b) // the node may have closed already
		_ = conn.(*net.TCPConn).CloseWrite()
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := io.Copy(io.Discard, conn)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the node kept the connection open 30 s after the client's last byte")
		}
		if got := metricValue(t, n, "peat_mqtt_panics_total"); got != 0 {
			t.Fatalf("peat_mqtt_panics_total = %v after % x", got, b)
		}
	})
}

// dialConnected opens a connection to addr and completes a CONNECT.
func dialConnected(t *testing.T, addr string, v5 bool) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if _, err := conn.Write(connectBytes(v5)); err != nil {
		t.Fatalf("CONNECT: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	head := make([]byte, 2)
	if _, err := io.ReadFull(conn, head); err != nil || head[0] != packets.Connack<<4 {
		t.Fatalf("CONNACK: % x, %v", head, err)
	}
	if _, err := io.CopyN(io.Discard, conn, int64(head[1])); err != nil {
		t.Fatalf("CONNACK body: %v", err)
	}
	return conn
}

// connectBytes is a clean CONNECT of client "fuzz".
func connectBytes(v5 bool) []byte {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: "fuzz",
			Clean: true, Keepalive: 60},
	}
	if v5 {
		pk.ProtocolVersion = 5
	}
	var buf bytes.Buffer
	if err := pk.ConnectEncode(&buf); err != nil {
		panic(err) // a fixed, valid packet
	}
	return buf.Bytes()
}

type ingressSeed struct {
	v5 bool
	b  []byte
}

// ingressSeeds are one of every packet a client sends, from mochi's own
// fixtures, and Peat's own topics: captured publishes, $replay, $group
// and $offsets subscriptions, a commit, the packets that once crashed the
// broker.
func ingressSeeds() []ingressSeed {
	var seeds []ingressSeed
	for typ, cases := range packets.TPacketData {
		if typ == packets.Connect {
			continue
		}
		for _, tc := range cases {
			if len(tc.RawBytes) > 0 {
				v5 := tc.Packet != nil && tc.Packet.ProtocolVersion == 5
				seeds = append(seeds, ingressSeed{v5, tc.RawBytes})
			}
		}
	}
	sub := func(v5 bool, id uint16, filter string, opts byte) []byte {
		body := binary.BigEndian.AppendUint16(nil, id)
		if v5 {
			body = append(body, 0)
		}
		body = binary.BigEndian.AppendUint16(body, uint16(len(filter)))
		body = append(append(body, filter...), opts)
		return append([]byte{packets.Subscribe<<4 | 2, byte(len(body))}, body...)
	}
	pub := func(v5 bool, topic string, qos byte, payload string) []byte {
		body := binary.BigEndian.AppendUint16(nil, uint16(len(topic)))
		body = append(body, topic...)
		if qos > 0 {
			body = append(body, 0, 7)
		}
		if v5 {
			body = append(body, 0)
		}
		body = append(body, payload...)
		return append([]byte{packets.Publish<<4 | qos<<1, byte(len(body))}, body...)
	}
	for _, v5 := range []bool{false, true} {
		seeds = append(seeds,
			ingressSeed{v5, pub(v5, "sensors/t", 1, "21.5")},
			ingressSeed{v5, append(pub(v5, "sensors/r", 1, "on"), sub(v5, 2, "sensors/#", 1)...)},
			ingressSeed{v5, sub(v5, 3, "$replay/earliest/+/sensors/#", 1)},
			ingressSeed{v5, sub(v5, 4, "$group/g/+/sensors/#", 1)},
			ingressSeed{v5, sub(v5, 5, "$offsets/g/default", 0)},
			ingressSeed{v5, pub(v5, "$offsets/g/default", 0, "0")},
		)
	}
	seeds = append(seeds,
		ingressSeed{true, []byte{0x82, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00}},
		ingressSeed{true, []byte{0x82, 0x06, 0x00, 0x01, 0x00, 0x00, 0x01, 0x61}})
	return seeds
}
