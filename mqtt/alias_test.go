package mqtt

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// aliasResolver is a client's side of topic aliases: it learns each alias
// from the PUBLISH that carries a topic with it, and resolves the ones that
// carry the alias alone.
type aliasResolver struct {
	tb       testing.TB
	max      uint16
	byAlias  map[uint16]string
	aliased  int // PUBLISHes that came with an empty topic
	maxAlias uint16
}

func newAliasResolver(tb testing.TB, max uint16) *aliasResolver {
	return &aliasResolver{tb: tb, max: max, byAlias: map[uint16]string{}}
}

// topic is pk's topic as the client knows it; it fails on an alias out of
// range or unknown, as a client must ([MQTT-3.3.2-8], [MQTT-3.3.4-2]).
func (r *aliasResolver) topic(pk packets.Packet) string {
	r.tb.Helper()
	p := pk.Properties
	if !p.TopicAliasFlag {
		if pk.TopicName == "" {
			r.tb.Fatal("PUBLISH without topic and without alias")
		}
		return pk.TopicName
	}
	if p.TopicAlias == 0 || p.TopicAlias > r.max {
		r.tb.Fatalf("topic alias %d outside 1..%d", p.TopicAlias, r.max)
	}
	r.maxAlias = max(r.maxAlias, p.TopicAlias)
	if pk.TopicName != "" {
		r.byAlias[p.TopicAlias] = pk.TopicName
		return pk.TopicName
	}
	t, ok := r.byAlias[p.TopicAlias]
	if !ok {
		r.tb.Fatalf("topic alias %d never set", p.TopicAlias)
	}
	r.aliased++
	return t
}

// dialAliases connects a clean v5 raw client offering max topic aliases.
func dialAliases(tb testing.TB, b *Broker, id string, max uint16) *mqtttest.Raw {
	tb.Helper()
	return dialDlvRaw(tb, b.Addr().String(), id, 5, packets.Properties{TopicAliasMaximum: max})
}

const longTopic = "factory/line-3/cell-12/robot-7/joint-4/temperature"

// A client that offers topic aliases gets a repeated topic once; later
// PUBLISHes carry the alias alone, smaller by the topic's length, and
// resolve to the same topic.
func TestTopicAlias_RepeatedTopicIsSentOnce(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialAliases(t, b, "sub", 4)
	c.Subscribe("factory/#", 1)
	topics := make([]string, 5)
	for i := range topics {
		topics[i] = longTopic
	}
	store(t, s, topics, nil)
	r := newAliasResolver(t, 4)
	pks := readPublishes(t, c, 5)
	for i, pk := range pks {
		if got := r.topic(pk); got != longTopic {
			t.Fatalf("delivery %d resolves to %q, want %q", i, got, longTopic)
		}
	}
	if r.aliased != 4 {
		t.Fatalf("%d of 5 deliveries came with the alias alone, want 4", r.aliased)
	}
	first, later := pks[0].FixedHeader.Remaining, pks[1].FixedHeader.Remaining
	if want := first - len(longTopic); later != want {
		t.Fatalf("aliased PUBLISH: %d bytes after the fixed header, want %d (the first, %d, less the topic)", later, want, first)
	}
}

// With more topics than aliases, the least recently used alias goes to the
// new topic, and the client resolves every message right.
func TestTopicAlias_MoreTopicsThanAliases(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialAliases(t, b, "sub", 2)
	c.Subscribe("t/#", 1)
	// a b a c a b b: c takes b's alias (a was used since), then b takes
	// the least recently used one, c's.
	want := []string{"t/aaaa", "t/bbbb", "t/aaaa", "t/cccc", "t/aaaa", "t/bbbb", "t/bbbb"}
	store(t, s, want, nil)
	r := newAliasResolver(t, 2)
	for i, pk := range readPublishes(t, c, len(want)) {
		if got := r.topic(pk); got != want[i] {
			t.Fatalf("delivery %d resolves to %q, want %q", i, got, want[i])
		}
	}
	if r.aliased != 3 { // the second a, the third a and the second b
		t.Fatalf("%d deliveries came with the alias alone, want 3", r.aliased)
	}
}

// Peat uses at most Config.TopicAliases aliases, and none when it is 0 or
// when the client offers none (or speaks MQTT 3.1.1).
func TestTopicAlias_Limits(t *testing.T) {
	topics := topicsN("t/long-topic-name", 0, 6)
	for _, tc := range []struct {
		name    string
		cap     int
		version byte
		offered uint16
		want    uint16 // the highest alias expected; 0: none
	}{
		{"client offers none", 16, 5, 0, 0},
		{"MQTT 3.1.1", 16, 4, 0, 0},
		{"cap 0", 0, 5, 10, 0},
		{"cap below client", 3, 5, 10, 3},
		{"client below cap", 16, 5, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l, func(c *Config) { c.TopicAliases = tc.cap })
			c := dialDlvRaw(t, b.Addr().String(), "sub", tc.version, packets.Properties{TopicAliasMaximum: tc.offered})
			c.Subscribe("t/#", 1)
			store(t, s, append(topics, topics...), nil)
			r := newAliasResolver(t, max(tc.offered, 1))
			for i, pk := range readPublishes(t, c, 2*len(topics)) {
				if tc.want == 0 && pk.Properties.TopicAliasFlag {
					t.Fatalf("delivery %d carries topic alias %d", i, pk.Properties.TopicAlias)
				}
				if got := r.topic(pk); got != topics[i%len(topics)] {
					t.Fatalf("delivery %d resolves to %q, want %q", i, got, topics[i%len(topics)])
				}
			}
			if r.maxAlias != tc.want {
				t.Fatalf("highest alias used %d, want %d", r.maxAlias, tc.want)
			}
		})
	}
}

// Aliases belong to a connection: after a reconnect, what comes again
// (unacknowledged deliveries) and what comes next carry their topic first.
func TestTopicAlias_ResetOnReconnect(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	connect := durableConnect("dur", 5)
	connect.Properties.TopicAliasMaximum = 4
	c := mqtttest.Dial(t, b.Addr().String(), connect)
	c.Subscribe("factory/#", 1)
	store(t, s, []string{longTopic, longTopic, longTopic}, nil)
	r := newAliasResolver(t, 4)
	for range 3 { // read, never acknowledged
		if got := r.topic(c.Read()); got != longTopic {
			t.Fatalf("delivery resolves to %q, want %q", got, longTopic)
		}
	}
	if r.aliased != 2 {
		t.Fatalf("%d deliveries came with the alias alone, want 2", r.aliased)
	}
	leave(t, b, c)

	c = mqtttest.Dial(t, b.Addr().String(), connect)
	r = newAliasResolver(t, 4) // a new connection knows no alias
	for i, pk := range readPublishes(t, c, 3) {
		if got := r.topic(pk); got != longTopic {
			t.Fatalf("redelivery %d resolves to %q, want %q", i, got, longTopic)
		}
	}
}

// mochi's own deliveries (a topic no stream captures) carry no alias, so
// they cannot clash with Peat's: the client resolves both right.
func TestTopicAlias_MochiDeliveriesUseNone(t *testing.T) {
	l := newMemLog(t, "default=d/#") // u/# is mochi's
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialAliases(t, b, "sub", 4)
	c.Subscribe("d/#", 1)
	c.Subscribe("u/#", 1)
	pub := dialRaw(t, b, "pub", 5)
	r := newAliasResolver(t, 4)
	for i := range 3 {
		store(t, s, []string{"d/peat-topic"}, nil)
		if got := r.topic(readPublishes(t, c, 1)[0]); got != "d/peat-topic" {
			t.Fatalf("round %d: Peat's delivery resolves to %q", i, got)
		}
		pub.Publish("u/mochi-topic", 1, uint16(i+1), "m")
		pub.ReadUntil(packets.Puback)
		pk := readPublishes(t, c, 1)[0]
		if pk.Properties.TopicAliasFlag {
			t.Fatalf("round %d: mochi's delivery carries alias %d", i, pk.Properties.TopicAlias)
		}
		if got := r.topic(pk); got != "u/mochi-topic" {
			t.Fatalf("round %d: mochi's delivery resolves to %q", i, got)
		}
	}
}

// An aliased PUBLISH (empty topic, alias property) is encoded as mochi
// encodes it.
func TestAppendPublish_AliasSameBytesAsMochi(t *testing.T) {
	for _, topic := range []string{"", longTopic} {
		pk := packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 9,
			TopicName: topic, Payload: []byte("21.5"),
			Properties: packets.Properties{TopicAlias: 7, TopicAliasFlag: true, ContentType: "text/plain"},
		}
		got := appendPublish(nil, &pk, nil, true, true)
		if want := mochiPublish(t, pk, true); !bytes.Equal(got, want) {
			t.Errorf("topic %q:\n got  % x\n want % x", topic, got, want)
		}
	}
}

// topicAliases hands out each alias once, reuses the least recently used
// one when full, and gives back an alias whose binding was never sent.
func TestTopicAliases_Table(t *testing.T) {
	a := newTopicAliases(2)
	steps := []struct {
		topic string
		alias uint16
		known bool
	}{
		{"x", 1, false}, {"y", 2, false}, {"x", 1, true}, {"z", 2, false}, {"y", 1, false}, {"z", 2, true},
	}
	for i, s := range steps {
		alias, known := a.use(s.topic)
		if alias != s.alias || known != s.known {
			t.Fatalf("step %d (%s): alias %d known %v, want %d %v", i, s.topic, alias, known, s.alias, s.known)
		}
	}
	a.forget("z")
	if alias, known := a.use("w"); alias != 2 || known {
		t.Fatalf("after forget: alias %d known %v, want 2 false", alias, known)
	}
	if newTopicAliases(0) != nil {
		t.Fatal("a table of 0 aliases")
	}
	var none *topicAliases
	pk := packets.Packet{TopicName: "some/topic"}
	if none.apply(&pk) || pk.Properties.TopicAliasFlag {
		t.Fatal("no table, yet an alias")
	}
}

// A PUBLISH too large for the client is skipped; if it was to bind an
// alias, the next PUBLISH of its topic binds it instead.
func TestTopicAlias_SkippedPublishBindsNothing(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDlvRaw(t, b.Addr().String(), "sub", 5, packets.Properties{TopicAliasMaximum: 4, MaximumPacketSize: 512})
	c.Subscribe("factory/#", 1)
	recs := []*logstore.Record{
		{Topic: longTopic, Payload: bytes.Repeat([]byte("x"), 1024), QoS: 1}, // over the client's maximum
		{Topic: longTopic, Payload: []byte("small"), QoS: 1},
		{Topic: longTopic, Payload: []byte("small"), QoS: 1},
	}
	done := make(chan error, 1)
	s.AppendAsync(recs, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r := newAliasResolver(t, 4)
	for i, pk := range readPublishes(t, c, 2) {
		if got := r.topic(pk); got != longTopic {
			t.Fatalf("delivery %d resolves to %q", i, got)
		}
	}
	if r.aliased != 1 {
		t.Fatalf("%d deliveries came with the alias alone, want 1", r.aliased)
	}
}

func TestConfig_TopicAliasesRange(t *testing.T) {
	for _, n := range []int{-1, 65536} {
		cfg := DefaultConfig()
		cfg.TopicAliases = n
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "topic_aliases") {
			t.Errorf("TopicAliases %d: %v, want an error naming topic_aliases", n, err)
		}
	}
	cfg := DefaultConfig()
	cfg.TopicAliases = 0
	if err := cfg.Validate(); err != nil {
		t.Errorf("TopicAliases 0 (off): %v", err)
	}
}
