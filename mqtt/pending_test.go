package mqtt

import (
	"net"
	"testing"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// dialFrom connects to b from the local address ip (any 127.0.0.0/8
// address reaches a loopback listener on Linux), closed at cleanup.
func dialFrom(tb testing.TB, b *Broker, ip string) net.Conn {
	tb.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	conn, err := d.Dial("tcp", b.Addr().String())
	if err != nil {
		tb.Fatalf("dial from %s: %v", ip, err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// 300 silent sockets from one address hold only that address's share of
// the pending connections: the rest are closed at once and counted, and
// clients from other addresses connect as usual.
func TestGuard_PendingPerAddressBounded(t *testing.T) {
	m := NewMetrics(nil)
	b := newTestBroker(t, newMemLog(t, "default=#"), func(c *Config) {
		c.ConnectTimeout = time.Hour
		c.Metrics = m
	})
	gl := b.mu.listeners[0]
	perAddr := DefaultConfig().MaxPendingPerAddress
	const silent = 300
	for range silent {
		dialFrom(t, b, "127.0.0.2")
	}
	refused := float64(silent - perAddr)
	testwait.Eventually(t, "the excess closed", func() bool {
		return metricValue(m.Closed.WithLabelValues(ReasonTooManyPendingFromAddress)) == refused
	})
	if n := gl.pending(); n != perAddr {
		t.Fatalf("%d pending, want %d (max_pending_per_address)", n, perAddr)
	}
	if got := metricValue(m.Closed.WithLabelValues(ReasonTooManyPending)); got != 0 {
		t.Errorf("closed{too_many_pending} = %v, want 0", got)
	}
	c := dialRaw(t, b, "other-address", 5) // from 127.0.0.1
	c.Ping()
}

// The key of a remote address: the address for IPv4, the /64 network for
// IPv6 (one host's share: a single subscriber often has a whole /64).
func TestPendingKey(t *testing.T) {
	cases := []struct{ a, b string }{
		{"192.0.2.1:1000", "192.0.2.1:2000"},
		{"[2001:db8::1]:1000", "[2001:db8::ffff:2]:2000"},
		{"[::ffff:192.0.2.1]:1000", "192.0.2.1:3000"},
	}
	for _, tc := range cases {
		ka, kb := pendingKey(addrOf(t, tc.a)), pendingKey(addrOf(t, tc.b))
		if ka != kb {
			t.Errorf("%s and %s: keys %v and %v, want one", tc.a, tc.b, ka, kb)
		}
	}
	if pendingKey(addrOf(t, "192.0.2.1:1")) == pendingKey(addrOf(t, "192.0.2.2:1")) {
		t.Error("two IPv4 hosts share a key")
	}
	if pendingKey(addrOf(t, "[2001:db8:0:1::1]:1")) == pendingKey(addrOf(t, "[2001:db8:0:2::1]:1")) {
		t.Error("two IPv6 /64s share a key")
	}
}

func addrOf(tb testing.TB, s string) net.Addr {
	tb.Helper()
	a, err := net.ResolveTCPAddr("tcp", s)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}
