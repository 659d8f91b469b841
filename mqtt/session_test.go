package mqtt

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// durableConnect is a CONNECT for a persistent session: clean session false
// (3.1.1) or a session expiry (5).
func durableConnect(id string, version byte) mqtttest.Connect {
	c := mqtttest.Connect{ClientID: id, Version: version, Keepalive: 60}
	if version == 5 {
		c.Properties.SessionExpiryInterval, c.Properties.SessionExpiryIntervalFlag = 3600, true
	}
	return c
}

// dialDurable connects client "dur" with a persistent session.
func dialDurable(tb testing.TB, b *Broker, version byte) *mqtttest.Raw {
	tb.Helper()
	return mqtttest.Dial(tb, b.Addr().String(), durableConnect("dur", version))
}

// leave closes c's connection and waits until the broker has let it go.
func leave(tb testing.TB, b *Broker, c *mqtttest.Raw) {
	tb.Helper()
	c.Close()
	testwait.Eventually(tb, "the client to go", func() bool { return b.Clients() == 0 })
}

// storedSession reports whether the log's state store holds id's session.
func storedSession(l *memLog, id string) bool {
	_, ok := l.stateValue(sessionStatePrefix + id)
	return ok
}

// expectTopics reads n publishes and checks their topics are
// "<prefix>/<from+i>", in order, and that nothing else follows: the next
// record stored in s, "<prefix>/<from+n>", is the next delivery.
func expectTopics(tb testing.TB, c *mqtttest.Raw, s *memStream, prefix string, from, n int) {
	tb.Helper()
	for i, pk := range readPublishes(tb, c, n) {
		if want := fmt.Sprintf("%s/%d", prefix, from+i); pk.TopicName != want {
			tb.Fatalf("delivery %d: %q, want %q", i, pk.TopicName, want)
		}
	}
	expectNext(tb, c, s, fmt.Sprintf("%s/%d", prefix, from+n))
}

// A persistent session gets, on reconnect, every message it missed while
// offline, from the log: more than any in-memory queue holds.
func TestDurableSession_CatchesUpFromTheLog(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l, func(c *Config) { c.QueueDepth = 16 })
			c := dialDurable(t, b, version)
			c.Subscribe("d/#", 1)
			store(t, s, topicsN("d", 0, 5), nil)
			expectTopics(t, c, s, "d", 0, 5)
			leave(t, b, c)

			store(t, s, topicsN("d", 5, 2000), nil) // while offline: far more than QueueDepth
			c = dialDurable(t, b, version)
			if !c.Connack.SessionPresent {
				t.Fatal("CONNACK: session not present")
			}
			expectTopics(t, c, s, "d", 5, 2000) // no re-subscribe: the session has it
			store(t, s, []string{"d/live"}, nil)
			if pk := readPublishes(t, c, 1)[0]; pk.TopicName != "d/live" {
				t.Fatalf("after catching up: %q, want d/live", pk.TopicName)
			}
		})
	}
}

// Unacknowledged deliveries of the old connection come again, once, from
// the log, not also from mochi's inflight resend.
func TestDurableSession_UnackedComeAgainOnce(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 4)
	c.Subscribe("d/#", 1)
	store(t, s, topicsN("d", 0, 10), nil)
	for i := range 10 {
		if pk := c.Read(); i < 4 {
			c.Puback(pk.PacketID)
		}
	}
	acksRead(t, c)
	leave(t, b, c)
	c = dialDurable(t, b, 4)
	expectTopics(t, c, s, "d", 4, 6)
}

// The session, its subscriptions and its offsets are in the log's state
// store: after a broker restart the client finds its session present and
// gets what it missed.
func TestDurableSession_SurvivesABrokerRestart(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 5)
	c.Subscribe("d/#", 1)
	store(t, s, topicsN("d", 0, 3), nil)
	expectTopics(t, c, s, "d", 0, 3)
	acksRead(t, c) // the marker's ack too: it is not sent again
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}

	store(t, s, topicsN("d", 3, 7), nil) // while the broker is down
	b2 := newTestBroker(t, l)
	c = dialDurable(t, b2, 5)
	if !c.Connack.SessionPresent {
		t.Fatal("after restart: session not present")
	}
	expectTopics(t, c, s, "d", 3, 7)
}

// A clean session ends the stored one: nothing is kept for it.
func TestDurableSession_CleanStartForgetsIt(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 4)
	c.Subscribe("d/#", 1)
	leave(t, b, c)
	c = dialRaw(t, b, "dur", 4) // clean
	if c.Connack.SessionPresent {
		t.Fatal("clean session: session present")
	}
	leave(t, b, c)
	store(t, s, topicsN("d", 0, 3), nil)
	c = dialDurable(t, b, 4)
	if c.Connack.SessionPresent {
		t.Fatal("after a clean session: an old session is present")
	}
	// The old session's d/# is gone: on a new subscription, a new record
	// is the first delivery, not d/0..d/2 from before it.
	c.Subscribe("m/#", 1)
	expectNext(t, c, s, "m/0")
	testwait.Eventually(t, "the new session to be stored", func() bool { return storedSession(l, "dur") })
}

// An expired session releases its cursor, its stored state and its
// subscriptions.
func TestDurableSession_ExpiryReleasesIt(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 4)
	c.Subscribe("d/#", 1)
	leave(t, b, c)
	cl, ok := b.srv.Clients.Get("dur")
	if !ok {
		t.Fatal("no session")
	}
	b.deliv.OnClientExpired(cl) // what mochi calls when the expiry passes
	testwait.Eventually(t, "the stored session to go", func() bool { return !storedSession(l, "dur") })
	if subs := b.srv.Topics.Subscribers("d/x"); len(subs.Subscriptions) != 0 {
		t.Fatalf("expired session still subscribed: %v", subs.Subscriptions)
	}
}

// A durable session that subscribed and left before anything was published
// still gets what was published while it was away.
func TestDurableSession_LeftBeforeAnyRecord(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 4)
	c.Subscribe("d/#", 1)
	leave(t, b, c)
	store(t, s, topicsN("d", 0, 3), nil)
	c = dialDurable(t, b, 4)
	expectTopics(t, c, s, "d", 0, 3)
}

// A v5 client that reconnects with Clean Start 0 and no Session Expiry
// Interval (paho's Python client does) resumes its stored session and gets
// what it missed ([MQTT-3.1.2-5]); the absent expiry means the session ends
// with that connection, not before it.
func TestDurableSession_ResumesWithoutExpiryAndEndsWithThatConnection(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 5)
	c.Subscribe("d/#", 1)
	store(t, s, topicsN("d", 0, 2), nil)
	expectTopics(t, c, s, "d", 0, 2) // and d/2, the barrier
	leave(t, b, c)

	store(t, s, topicsN("d", 3, 5), nil) // while away
	// Clean Start 0, no Session Expiry Interval.
	noExpiry := mqtttest.Connect{ClientID: "dur", Version: 5, Keepalive: 60}
	c = mqtttest.Dial(t, b.Addr().String(), noExpiry)
	if !c.Connack.SessionPresent {
		t.Fatal("CONNACK: session not present")
	}
	expectTopics(t, c, s, "d", 3, 5)
	store(t, s, []string{"d/live"}, nil)
	if pk := readPublishes(t, c, 1)[0]; pk.TopicName != "d/live" {
		t.Fatalf("after catching up: %q, want d/live", pk.TopicName)
	}
	testwait.Eventually(t, "the session to leave the store", func() bool { return !storedSession(l, "dur") })
	leave(t, b, c)

	// The session ended with that connection: nothing kept, nothing resumed.
	store(t, s, topicsN("d", 9, 3), nil)
	c = dialDurable(t, b, 5)
	if c.Connack.SessionPresent {
		t.Fatal("after a connection without expiry ended: session present")
	}
	// A new subscription starts at the log's end; a resumed cursor would
	// deliver d/9 first.
	c.Subscribe("d/#", 1)
	expectNext(t, c, s, "d/after")
}

// A v5 DISCONNECT that sets the Session Expiry Interval to 0 ends the
// session when the connection closes.
func TestDurableSession_DisconnectWithExpiryZeroEndsIt(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 5)
	c.Subscribe("d/#", 1)
	testwait.Eventually(t, "the session to be stored", func() bool { return storedSession(l, "dur") })
	dis := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}}
	dis.Properties.SessionExpiryInterval, dis.Properties.SessionExpiryIntervalFlag = 0, true
	c.Write(dis)
	testwait.Eventually(t, "the client to go", func() bool { return b.Clients() == 0 })
	testwait.Eventually(t, "the stored session to go", func() bool { return !storedSession(l, "dur") })
	store(t, s, topicsN("d", 0, 3), nil)
	c = dialDurable(t, b, 5)
	if c.Connack.SessionPresent {
		t.Fatal("session present after DISCONNECT with expiry 0")
	}
	c.Subscribe("d/#", 1) // starts at the log's end; a resumed cursor would deliver d/0 first
	expectNext(t, c, s, "d/3")
}

// Clean Start 1 with a Session Expiry Interval starts a new session: the
// old one's position in the log is not where the new one's subscriptions
// start.
func TestDurableSession_CleanStartWithExpiryStartsAfresh(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 5)
	c.Subscribe("d/#", 1)
	leave(t, b, c)
	store(t, s, topicsN("d", 0, 3), nil) // the old session's, not the new one's

	fresh := durableConnect("dur", 5)
	fresh.Clean = true
	c = mqtttest.Dial(t, b.Addr().String(), fresh)
	if c.Connack.SessionPresent {
		t.Fatal("Clean Start 1: session present")
	}
	c.Subscribe("d/#", 1)
	store(t, s, []string{"d/new"}, nil)
	if pk := readPublishes(t, c, 1)[0]; pk.TopicName != "d/new" {
		t.Fatalf("first delivery of the new session: %q, want d/new", pk.TopicName)
	}
}

// A stored session whose user name declares a 4 GiB bin32 (a damaged
// record, or one forged by a peer of a site) fails to load without
// allocating what it declares.
func TestSession_ForgedLengthAllocatesNothing(t *testing.T) {
	v := []byte{0x81, 0xa1, 'u', 0xc6, 0xff, 0xff, 0xff, 0xf0, 'x'} // {"u": bin32 of 4 GiB, 1 byte there}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var s session
	err := msgpack.Unmarshal(v, &s)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a session with a truncated user name loaded")
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("decoding it allocated %d MiB", grew>>20)
	}
}

// A session an older Peat stored, its user name a bin, loads with it;
// and what this one stores (a str) decodes into a bin field as before.
func TestSession_UserNameReadsBothForms(t *testing.T) {
	type older struct {
		Username []byte `msgpack:"u,omitempty"`
	}
	b, err := msgpack.Marshal(older{Username: []byte("alice")})
	if err != nil {
		t.Fatal(err)
	}
	var s session
	if err := msgpack.Unmarshal(b, &s); err != nil || s.Username != "alice" {
		t.Fatalf("older record: %q, %v", s.Username, err)
	}
	if b, err = msgpack.Marshal(&session{Username: "bob"}); err != nil {
		t.Fatal(err)
	}
	var o older
	if err := msgpack.Unmarshal(b, &o); err != nil || string(o.Username) != "bob" {
		t.Fatalf("read by an older Peat: %q, %v", o.Username, err)
	}
}

// holdEstablished holds the connection of client id after its CONNACK,
// before delivery's OnSessionEstablished attaches it, once armed, until
// release is closed.
type holdEstablished struct {
	mochi.HookBase
	id      string
	armed   atomic.Bool
	held    chan struct{} // closed once it holds
	release chan struct{}
}

func (h *holdEstablished) ID() string           { return "hold-established" }
func (h *holdEstablished) Provides(b byte) bool { return b == mochi.OnSessionEstablished }
func (h *holdEstablished) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	if cl.ID == h.id && h.armed.Load() {
		close(h.held)
		<-h.release
	}
}

// A durable session that resumes, with a subscription, where it has no
// position in a stream (one added while it was away) gets what is
// published there once it has its CONNACK, even when delivery attaches
// the connection later: its position is taken before the CONNACK.
func TestDurableSession_GetsWhatIsPublishedOnceItHasItsConnack(t *testing.T) {
	l := newMemLog(t, "default=#")
	hold := &holdEstablished{id: "dur", held: make(chan struct{}), release: make(chan struct{})}
	b := newTestBroker(t, l, func(c *Config) { c.beforeDelivery = hold })
	c := dialDurable(t, b, 5)
	c.Subscribe("sensors/#", 1)
	leave(t, b, c)
	if _, err := l.ml.AddStream("sensors=sensors/#"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "delivery to read the added stream", func() bool { return b.deliv.reader("sensors") != nil })
	pub := dialRaw(t, b, "pub", 5)
	publishAcked(t, pub, "sensors/before", 1)

	hold.armed.Store(true)
	done := make(chan *mqtttest.Raw, 1)
	go func() { done <- dialDurable(t, b, 5) }()
	<-hold.held // dur has its CONNACK; delivery has not attached it yet
	publishAcked(t, pub, "sensors/after", 2)
	close(hold.release)
	c = <-done
	if pk := readPublishes(t, c, 1)[0]; pk.TopicName != "sensors/after" {
		t.Fatalf("dur got %q, want sensors/after (published once it had its CONNACK)", pk.TopicName)
	}
}
