package mqtt

import (
	"context"
	"net"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// storedOwner is the owner recorded with id's stored session.
func storedOwner(tb testing.TB, l *memLog, id string) string {
	tb.Helper()
	v, ok := l.stateValue(sessionStatePrefix + id)
	if !ok {
		tb.Fatalf("no stored session %q", id)
	}
	var s session
	if err := msgpack.Unmarshal(v, &s); err != nil {
		tb.Fatal(err)
	}
	return s.Owner
}

// A session stored without an owner (a broker without Auth, or a Peat
// before owners) is adopted by the first identity that connects to it,
// and is that identity's from then on.
func TestTenancy_SessionWithoutOwnerIsAdopted(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 5)
	c.Subscribe("d/#", 1)
	leave(t, b, c)
	if got := storedOwner(t, l, "dur"); got != "" {
		t.Fatalf("without Auth the session has owner %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}

	b2 := newTestBroker(t, l, func(c *Config) { c.Auth = secretAuth() })
	as := func(user string) mqtttest.Connect {
		c := durableConnect("dur", 5)
		c.Username = user
		return c
	}
	bob := mqtttest.Dial(t, b2.Addr().String(), as("bob"))
	if !bob.Connack.SessionPresent {
		t.Fatal("bob did not adopt the session without owner")
	}
	leave(t, b2, bob)
	if got := storedOwner(t, l, "dur"); got != "user:bob" {
		t.Fatalf("adopted session's owner %q, want user:bob", got)
	}
	store(t, s, topicsN("d", 0, 1), nil)

	conn, err := net.Dial("tcp", b2.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	alice := mqtttest.Handshake(t, conn, as("alice"))
	if alice.Connack.ReasonCode != packets.ErrNotAuthorized.Code || alice.Connack.SessionPresent {
		t.Fatalf("alice: CONNACK %#x present %v, want 0x87", alice.Connack.ReasonCode, alice.Connack.SessionPresent)
	}
	if got := metricValue(b2.m.Denied.WithLabelValues(DeniedSession)); got != 1 {
		t.Errorf("denied{reason=session} = %v, want 1", got)
	}
	bob = mqtttest.Dial(t, b2.Addr().String(), as("bob"))
	if !bob.Connack.SessionPresent {
		t.Fatal("bob lost his session to alice's attempt")
	}
	expectTopics(t, bob, s, "d", 0, 1)
}
