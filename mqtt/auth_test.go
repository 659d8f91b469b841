package mqtt

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// testRule is one rule of testAuth: ordered, first match wins, default
// deny. client "" is every client.
type testRule struct {
	client      string
	filter      string
	read, write bool // what the rule is about
	allow       bool
}

// testAuth is a small Auth for the broker's tests: every client is let in
// (unless refuse names it) and gets the rules that apply to it. Real
// rules live in edge/auth; this one exercises the broker's side.
type testAuth struct {
	rules  []testRule
	refuse string
	reads  atomic.Int64 // MayRead calls that were not answered by the subscription's filter
	// clientIDs says whose client ids a subscriber may see; nil: none.
	clientIDs func(id string) bool
}

func (a *testAuth) Authenticate(l Login) (Access, string, bool) {
	if l.ClientID == a.refuse {
		return nil, "refused by the test", false
	}
	return &testAccess{a: a, client: l.ClientID, user: l.Username}, "", true
}

type testAccess struct {
	a      *testAuth
	client string
	user   string
}

func (x *testAccess) decide(topic string, write bool) bool {
	for _, r := range x.a.rules {
		if (r.client == "" || r.client == x.client) && (write && r.write || !write && r.read) &&
			logstore.MatchFilter(r.filter, topic) {
			return r.allow
		}
	}
	return false
}

func (x *testAccess) MayPublish(topic string) bool { return x.decide(topic, true) }

// MaySubscribe: a rule whose filter matches the whole subscribed filter
// (read level by level, wildcards as literals) decides; otherwise the
// subscription is granted and each record is checked.
func (x *testAccess) MaySubscribe(filter string) bool {
	for _, r := range x.a.rules {
		if (r.client == "" || r.client == x.client) && r.read && logstore.MatchFilter(r.filter, filter) {
			return r.allow
		}
	}
	return true
}

// Tenancy: a client is its user, or without one its client id; every
// group is everyone's.
func (x *testAccess) Identity() string {
	if x.user != "" {
		return "user:" + x.user
	}
	return "client:" + x.client
}
func (x *testAccess) MayUseClientID() bool               { return true }
func (x *testAccess) MayGroup(group string, _ bool) bool { return true }

func (x *testAccess) MayReadClientID(id string) bool {
	return x.a.clientIDs != nil && x.a.clientIDs(id)
}

func (x *testAccess) MayRead(filter, topic string) bool {
	x.a.reads.Add(1)
	return x.decide(topic, false)
}

// secretAuth denies reading secret/# to everyone and allows everything
// else.
func secretAuth() *testAuth {
	return &testAuth{rules: []testRule{
		{filter: "secret/#", read: true, allow: false},
		{filter: "#", read: true, write: true, allow: true},
		{filter: "$offsets/#", read: true, write: true, allow: true},
	}}
}

// expectOnlyOpen reads n deliveries and fails on any secret/ topic among
// them, then checks with expectNext that nothing else is on its way.
func expectOnlyOpen(tb testing.TB, c *mqtttest.Raw, s *memStream, n int, next string) {
	tb.Helper()
	for _, pk := range readPublishes(tb, c, n) {
		if strings.Contains(pk.TopicName, "secret/") {
			tb.Fatalf("delivered %q: the ACL denies reading secret/#", pk.TopicName)
		}
	}
	expectNext(tb, c, s, next)
}

// mixed is what the leak tests store: secret records before and between
// open ones, so a leaked one would arrive before the open one it precedes.
var mixed = []string{"secret/a", "open/1", "secret/b", "secret/c", "open/2"}

// A subscription to # beside a denied subtree gets nothing from it, on
// every path a record takes from the log to a client.
func TestAuth_ReadACLBindsEveryDelivery(t *testing.T) {
	t.Run("live", func(t *testing.T) {
		for _, version := range []byte{4, 5} {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l, func(c *Config) { c.Auth = secretAuth() })
			c := dialRaw(t, b, "sub", version)
			c.Subscribe("#", 1)
			store(t, s, mixed, nil)
			expectOnlyOpen(t, c, s, 2, "open/3")
			if got := metricValue(b.m.Dropped.WithLabelValues(ReasonNotAuthorized)); got != 3 {
				t.Errorf("v%d: %v records counted as not_authorized, want 3", version, got)
			}
		}
	})
	t.Run("lagging subscriber's own cursor", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		s := l.stream(t, "default")
		b := newTestBroker(t, l, func(c *Config) { c.Auth = secretAuth(); c.QueueDepth = 2 })
		c := dialRaw(t, b, "sub", 5)
		c.Subscribe("#", 1)
		var topics []string
		for range 20 { // far more than the queue: the subscriber falls back to its cursor
			topics = append(topics, mixed...)
		}
		store(t, s, topics, nil)
		expectOnlyOpen(t, c, s, 40, "open/3")
	})
	t.Run("shared", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		s := l.stream(t, "default")
		b := newTestBroker(t, l, func(c *Config) { c.Auth = secretAuth() })
		c := dialRaw(t, b, "sub", 5)
		c.Subscribe("$share/g/#", 1)
		store(t, s, mixed, nil)
		expectOnlyOpen(t, c, s, 2, "open/3")
	})
	for _, filter := range []string{"$replay/earliest/+/#", "$group/g/+/#"} {
		t.Run(filter, func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			store(t, s, mixed, nil) // history
			b := newTestBroker(t, l, func(c *Config) { c.Auth = secretAuth() })
			c := dialRaw(t, b, "sub", 5)
			c.Subscribe(filter, 1)
			for _, pk := range readPublishes(t, c, 2) {
				if strings.Contains(pk.TopicName, "secret/") {
					t.Fatalf("replayed %q", pk.TopicName)
				}
			}
			store(t, s, mixed, nil) // live, through the same tap
			expectOnlyOpen(t, c, s, 2, "open/3")
		})
	}
	t.Run("resumed durable session", func(t *testing.T) {
		for _, version := range []byte{4, 5} {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l, func(c *Config) { c.Auth = secretAuth() })
			c := dialDurable(t, b, version)
			c.Subscribe("#", 1)
			expectNext(t, c, s, "open/0")
			leave(t, b, c)
			store(t, s, mixed, nil) // while offline
			c = dialDurable(t, b, version)
			if !c.Connack.SessionPresent {
				t.Fatalf("v%d: session not present", version)
			}
			expectOnlyOpen(t, c, s, 2, "open/3")
		}
	})
	t.Run("retained", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		b := newTestBroker(t, l, func(c *Config) { c.Auth = secretAuth() })
		st := l.stream(t, "default")
		appendDirect(t, st, retainedRec("secret/r", "x"))
		appendDirect(t, st, retainedRec("open/r", "y"))
		testwait.Eventually(t, "the retained messages", func() bool {
			return len(retainedPayloads(b, "secret/r")) == 1 && len(retainedPayloads(b, "open/r")) == 1
		})
		c := dialRaw(t, b, "sub", 5)
		c.Subscribe("#", 1)
		if pk := readPublishes(t, c, 1)[0]; pk.TopicName != "open/r" {
			t.Fatalf("first retained message %q, want open/r", pk.TopicName)
		}
		expectNext(t, c, l.stream(t, "default"), "open/after")
	})
}

// A subscription that lies inside an allowed filter is not checked record
// by record when the Access says so at once: the cost stays per
// subscription. (testAccess answers per record; this checks that the
// broker asks with the subscription's filter, which edge/auth uses.)
func TestAuth_MayReadIsAskedWithTheSubscriptionsFilter(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	a := &filterRecorder{testAuth: secretAuth()}
	b := newTestBroker(t, l, func(c *Config) { c.Auth = a })
	c := dialRaw(t, b, "sub", 5)
	c.Subscribe("open/#", 1)
	c.Subscribe("$replay/earliest/+/open/#", 1)
	store(t, s, []string{"open/1"}, nil)
	readPublishes(t, c, 2)
	got := a.filters()
	if !got["open/#"] || len(got) != 1 {
		t.Fatalf("MayRead asked with filters %v, want only open/#", got)
	}
}

// filterRecorder records the filters MayRead is asked with.
type filterRecorder struct {
	*testAuth
	seen atomic.Pointer[map[string]bool]
}

func (f *filterRecorder) Authenticate(l Login) (Access, string, bool) {
	acc, why, ok := f.testAuth.Authenticate(l)
	if !ok {
		return nil, why, false
	}
	return &recordingAccess{Access: acc, f: f}, "", true
}

func (f *filterRecorder) filters() map[string]bool {
	if m := f.seen.Load(); m != nil {
		return *m
	}
	return nil
}

type recordingAccess struct {
	Access
	f *filterRecorder
}

func (r *recordingAccess) MayRead(filter, topic string) bool {
	for {
		old := r.f.seen.Load()
		m := map[string]bool{filter: true}
		if old != nil {
			for k := range *old {
				m[k] = true
			}
		}
		if r.f.seen.CompareAndSwap(old, &m) {
			break
		}
	}
	return r.Access.MayRead(filter, topic)
}

// Subscriptions no readable topic matches are refused, plain and inside
// $replay, with 0x87 (MQTT 5) or 0x80 (3.1.1): the conformance suite's
// test/nosubscribe case.
func TestAuth_SubscriptionToADeniedFilterIsRefused(t *testing.T) {
	l := newMemLog(t, "default=#")
	a := secretAuth()
	a.rules = append([]testRule{{filter: "test/nosubscribe", read: true, allow: false}}, a.rules...)
	b := newTestBroker(t, l, func(c *Config) { c.Auth = a })
	for _, version := range []byte{4, 5} {
		c := dialRaw(t, b, fmt.Sprintf("sub%d", version), version)
		want := byte(packets.ErrNotAuthorized.Code)
		if version == 4 {
			want = packets.ErrUnspecifiedError.Code
		}
		for _, f := range []string{"test/nosubscribe", "secret/#", "$replay/earliest/+/secret/#"} {
			if ack := c.TrySubscribe(f, 1); ack.ReasonCodes[0] != want {
				t.Errorf("v%d %s: SUBACK %#x, want %#x", version, f, ack.ReasonCodes[0], want)
			}
		}
		c.Subscribe("#", 1) // granted: other topics are readable
	}
	// Three filters for each version.
	if got := metricValue(b.m.Denied.WithLabelValues(DeniedSubscribe)); got != 6 {
		t.Errorf("peat_mqtt_denied_total{reason=subscribe} = %v, want 6", got)
	}
}

// A client Auth refuses gets CONNACK 0x86 (MQTT 5) or return code 4
// (3.1.1), and the refusal is counted.
func TestAuth_RefusedConnect(t *testing.T) {
	l := newMemLog(t, "default=#")
	a := secretAuth()
	a.refuse = "intruder"
	b := newTestBroker(t, l, func(c *Config) { c.Auth = a })
	for version, want := range map[byte]byte{5: packets.ErrBadUsernameOrPassword.Code, 4: 4} {
		conn := dialTCP(t, b)
		r := mqtttest.Handshake(t, conn, mqtttest.Connect{ClientID: "intruder", Version: version, Clean: true})
		if r.Connack.FixedHeader.Type != packets.Connack || r.Connack.ReasonCode != want {
			t.Errorf("v%d: CONNACK %#x, want %#x", version, r.Connack.ReasonCode, want)
		}
	}
	if got := metricValue(b.m.Denied.WithLabelValues(DeniedConnect)); got != 2 {
		t.Errorf("peat_mqtt_denied_total{reason=connect} = %v, want 2", got)
	}
}

// A refused publish is counted once, whichever path judged it.
func TestAuth_RefusedPublishCountedOnce(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l, func(c *Config) {
		c.Auth = &testAuth{rules: []testRule{{filter: "open/#", read: true, write: true, allow: true}}}
	})
	c := dialRaw(t, b, "p", 5)
	c.Publish("closed/a", 1, 1, "x")
	if ack := c.ReadUntil(packets.Puback); ack.ReasonCode != packets.ErrNotAuthorized.Code {
		t.Fatalf("PUBACK %#x, want 0x87", ack.ReasonCode)
	}
	if got := metricValue(b.m.Denied.WithLabelValues(DeniedPublish)); got != 1 {
		t.Errorf("peat_mqtt_denied_total{reason=publish} = %v, want 1", got)
	}
}

// A last will is a publish: a will on a topic the client may not publish
// to refuses the CONNECT (not authorized), since ingest appends the will
// later without asking again.
func TestAuth_WillTopicIsJudgedAtConnect(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l, func(c *Config) {
		c.Auth = &testAuth{rules: []testRule{{filter: "open/#", read: true, write: true, allow: true}}}
	})
	for version, want := range map[byte]byte{5: packets.ErrNotAuthorized.Code, 4: packets.Err3NotAuthorized.Code} {
		conn := dialTCP(t, b)
		c := rawConnect(fmt.Sprintf("w%d", version), version)
		c.Will = &mqtttest.Will{Topic: "closed/status", Payload: []byte("gone"), Qos: 1}
		r := mqtttest.Handshake(t, conn, c)
		if r.Connack.ReasonCode != want {
			t.Errorf("v%d will on a denied topic: CONNACK %#x, want %#x", version, r.Connack.ReasonCode, want)
		}
	}
	c := rawConnect("ok", 5)
	c.Will = &mqtttest.Will{Topic: "open/status", Payload: []byte("gone"), Qos: 1}
	if r := mqtttest.Handshake(t, dialTCP(t, b), c); r.Connack.ReasonCode != 0 {
		t.Errorf("will on an allowed topic: CONNACK %#x", r.Connack.ReasonCode)
	}
}
