package mqtt

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// store appends records to s directly (as ingest would) and waits until
// they are committed. Each record is "<topic>" with payload "p<offset>"
// and, when ts is not nil, the timestamp ts(i).
func store(tb testing.TB, s *memStream, topics []string, ts func(i int) time.Time) {
	tb.Helper()
	first := len(s.records())
	recs := make([]*logstore.Record, len(topics))
	for i, topic := range topics {
		recs[i] = &logstore.Record{Topic: topic, Payload: fmt.Appendf(nil, "p%d", first+i), QoS: 1}
		if ts != nil {
			recs[i].Timestamp = ts(i).UnixMilli()
		}
	}
	done := make(chan error, 1)
	s.AppendAsync(recs, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		tb.Fatal(err)
	}
}

// topicsN returns n topics "<prefix>/<i>".
func topicsN(prefix string, from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s/%d", prefix, from+i)
	}
	return out
}

// userProp returns the value of the first user property key, or "".
func userProp(p packets.Properties, key string) string {
	for _, u := range p.User {
		if u.Key == key {
			return u.Val
		}
	}
	return ""
}

// readPublishes reads n PUBLISHes from c, acknowledging QoS 1 ones, and
// fails on anything else but PINGRESP.
func readPublishes(tb testing.TB, c *mqtttest.Raw, n int) []packets.Packet {
	tb.Helper()
	out := make([]packets.Packet, 0, n)
	for len(out) < n {
		pk := c.Read()
		switch pk.FixedHeader.Type {
		case packets.Publish:
			if pk.FixedHeader.Qos == 1 {
				c.Puback(pk.PacketID)
			}
			out = append(out, pk)
		case packets.Pingresp:
		default:
			tb.Fatalf("got packet type %d, want PUBLISH", pk.FixedHeader.Type)
		}
	}
	return out
}

// expectNext stores a record on topic in s and checks that it is the next
// PUBLISH c receives (acknowledging QoS 1): the barrier that shows nothing
// else was on its way. A client's deliveries from one subscription (one
// tap, or its place on the shared reader) come in log order, so a record
// that should not have come before this one (a duplicate, one the filter
// excludes, one past a limit) arrives first and fails the test. A PING
// round trip cannot show that: it orders mochi's read loop, not the
// delivery goroutines, and a PINGRESP overtakes a delivery still on its way.
func expectNext(tb testing.TB, c *mqtttest.Raw, s *memStream, topic string) packets.Packet {
	tb.Helper()
	off := s.Committed()
	store(tb, s, []string{topic}, nil)
	pk := readPublishes(tb, c, 1)[0]
	if pk.TopicName != topic && !strings.HasSuffix(pk.TopicName, fmt.Sprintf("/%d/%s", off, topic)) {
		tb.Fatalf("got %q first, want the record at offset %d on %q", pk.TopicName, off, topic)
	}
	return pk
}

// acksRead waits until the broker has read and handled everything c sent
// so far (mochi handles one client's packets in order, and PUBACKs update
// delivery's state inline), failing if a PUBLISH arrives first. It orders
// mochi's read loop only: it cannot show that no delivery is on its way
// (expectNext can).
func acksRead(tb testing.TB, c *mqtttest.Raw) {
	tb.Helper()
	c.Ping()
	if pk := c.Read(); pk.FixedHeader.Type != packets.Pingresp {
		tb.Fatalf("got packet type %d (topic %q), want PINGRESP", pk.FixedHeader.Type, pk.TopicName)
	}
}

// parkedIn reports whether some goroutine is blocked (in a select or on a
// channel) inside the function named fn: a delivery goroutine waiting,
// rather than one that has not got there yet.
func parkedIn(fn string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if (strings.Contains(header, "[select") || strings.Contains(header, "[chan ")) &&
			strings.Contains(g, "mqtt."+fn+"(") {
			return true
		}
	}
	return false
}

// clientTaps returns the filters of the extension subscriptions that
// client id has installed.
func clientTaps(tb testing.TB, b *Broker, id string) []string {
	tb.Helper()
	cl, ok := b.srv.Clients.Get(id)
	if !ok {
		tb.Fatalf("client %s is not connected", id)
	}
	c := b.deliv.client(cl)
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for f := range c.mu.taps {
		out = append(out, f)
	}
	return out
}

func TestReplay_FromEachKindOfPosition(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	now := time.Now()
	// Records 0..9, one an hour apart, the last one hour ago.
	store(t, s, topicsN("t", 0, 10), func(i int) time.Time { return now.Add(-time.Duration(10-i) * time.Hour) })
	b := newTestBroker(t, l)

	cases := []struct {
		from  string
		first uint64
	}{
		{"earliest", 0},
		{"3", 3},
		{"-5h30m", 5}, // records from 5 hours ago on
		{"-1d", 0},
		{now.Add(-150 * time.Minute).UTC().Format(time.RFC3339), 8},
	}
	for _, tc := range cases {
		t.Run(tc.from, func(t *testing.T) {
			c := dialRaw(t, b, "replay-"+tc.from, 5)
			filter := "$replay/" + tc.from + "/+/t/#"
			end := s.Committed() // 10, and one more after each case
			ack := c.Subscribe(filter, 1)
			if got := userProp(ack.Properties, propStart); got != strconv.FormatUint(tc.first, 10) {
				t.Errorf("SUBACK start = %q, want %d", got, tc.first)
			}
			if got := userProp(ack.Properties, propEnd); got != strconv.FormatUint(end, 10) {
				t.Errorf("SUBACK end = %q, want %d", got, end)
			}
			if got := userProp(ack.Properties, propStream); got != "default" {
				t.Errorf("SUBACK stream = %q, want default", got)
			}
			pks := readPublishes(t, c, int(end-tc.first))
			for i, pk := range pks {
				off := tc.first + uint64(i)
				want := fmt.Sprintf("$replay/%s/%d/t/%d", tc.from, off, off)
				if pk.TopicName != want || string(pk.Payload) != fmt.Sprintf("p%d", off) {
					t.Fatalf("delivery %d: %q %q, want %q p%d", i, pk.TopicName, pk.Payload, want, off)
				}
				if userProp(pk.Properties, propOffset) != strconv.FormatUint(off, 10) ||
					userProp(pk.Properties, propStream) != "default" ||
					userProp(pk.Properties, propTimestamp) != strconv.FormatInt(s.records()[off].Timestamp, 10) {
					t.Fatalf("delivery %d: user properties %v", i, pk.Properties.User)
				}
			}
			// The next record, at offset end, is the next delivery:
			// nothing else (a repeat, a record past the end) came between.
			expectNext(t, c, s, fmt.Sprintf("t/%d", end))
		})
	}

	t.Run("latest then live", func(t *testing.T) {
		c := dialRaw(t, b, "replay-latest", 4)
		c.Subscribe("$replay/latest/+/t/#", 1)
		// The first record stored after the subscription is the first
		// delivery: no history came before it.
		expectNext(t, c, s, "t/new")
	})
}

func TestReplay_RefusalsSayWhy(t *testing.T) {
	l := newMemLog(t, "default=#", "sensors=sensors/#")
	store(t, l.stream(t, "sensors"), topicsN("sensors", 0, 3), nil)
	b := newTestBroker(t, l)
	cases := []struct {
		filter string
		code   byte
		says   string
	}{
		{"$replay/soon/+/sensors/#", subackInvalid, "want earliest, latest"},
		{"$replay/earliest/sensors/#", subackInvalid, "must be '+'"},
		{"$replay/earliest/+", subackInvalid, "no filter"},
		{"$replay/earliest/+/#", subackNotAccepted, "spans streams default, sensors"},
		{"$replay/earliest/+/+/temp", subackNotAccepted, "spans streams"},
		{"$group/+/+/sensors/#", subackInvalid, "wildcards"},
		{"$offsets/g/nosuch", subackNotAccepted, `no stream "nosuch"`},
	}
	v5 := dialRaw(t, b, "v5", 5)
	v3 := dialRaw(t, b, "v3", 4)
	for _, tc := range cases {
		ack := v5.TrySubscribe(tc.filter, 1)
		if ack.ReasonCodes[0] != tc.code || !strings.Contains(ack.Properties.ReasonString, tc.says) {
			t.Errorf("v5 %s: SUBACK %#x %q, want %#x saying %q", tc.filter, ack.ReasonCodes[0], ack.Properties.ReasonString, tc.code, tc.says)
		}
		if ack := v3.TrySubscribe(tc.filter, 1); ack.ReasonCodes[0] != 0x80 {
			t.Errorf("v3 %s: SUBACK %#x, want 0x80", tc.filter, ack.ReasonCodes[0])
		}
	}
	// A refused filter is served by nothing (taps are installed before
	// the SUBACK is written), and the client stays connected.
	for _, id := range []string{"v5", "v3"} {
		if taps := clientTaps(t, b, id); len(taps) != 0 {
			t.Errorf("%s: refused filters have taps %v", id, taps)
		}
	}

	// A stream's own filters are fine.
	const ok = "$replay/earliest/+/sensors/#"
	for _, c := range []*mqtttest.Raw{v5, v3} {
		ack := c.Subscribe(ok, 1)
		if ack.ReasonCodes[0] != 1 {
			t.Fatalf("granted %#x, want QoS 1", ack.ReasonCodes[0])
		}
		for i, pk := range readPublishes(t, c, 3) {
			if want := fmt.Sprintf("$replay/earliest/%d/sensors/%d", i, i); pk.TopicName != want {
				t.Fatalf("delivery %d: %q, want %q", i, pk.TopicName, want)
			}
		}
	}
	for _, id := range []string{"v5", "v3"} {
		if taps := clientTaps(t, b, id); len(taps) != 1 || taps[0] != ok {
			t.Errorf("%s: taps %v, want only %s", id, taps, ok)
		}
	}
}

func TestReplay_BelowLogStartStartsThereAndSaysSo(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	store(t, s, topicsN("t", 0, 10), nil)
	s.trim(6) // retention dropped 0..5
	b := newTestBroker(t, l)
	c := dialRaw(t, b, "late", 5)
	ack := c.Subscribe("$replay/2/+/t/#", 1)
	if got := userProp(ack.Properties, propStart); got != "6" {
		t.Fatalf("SUBACK start = %q, want 6", got)
	}
	if n := userProp(ack.Properties, propNotice); !strings.Contains(n, "below the log start 6") {
		t.Fatalf("SUBACK notice = %q, want one about the log start", n)
	}
	pks := readPublishes(t, c, 4)
	if pks[0].TopicName != "$replay/2/6/t/6" {
		t.Fatalf("first delivery %q, want offset 6", pks[0].TopicName)
	}
	if v := metricValue(b.deliv.m.StartAdjusted); v != 1 {
		t.Fatalf("peat_mqtt_replay_start_adjusted_total = %v, want 1", v)
	}
}

// After UNSUBSCRIBE, a replay's tap stops: records stored afterwards are not
// delivered on the replay, while the client's other subscription goes on.
func TestReplay_StopsOnUnsubscribe(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialRaw(t, b, "unsub", 4)
	c.Subscribe("$replay/earliest/+/t/#", 1)
	c.Subscribe("m/#", 1) // live, from the shared reader
	store(t, s, []string{"t/a"}, nil)
	if pk := readPublishes(t, c, 1)[0]; pk.TopicName != "$replay/earliest/0/t/a" {
		t.Fatalf("got %q, want the replay of t/a", pk.TopicName)
	}
	c.Unsubscribe("$replay/earliest/+/t/#")
	// The tap's goroutine ends: while it ran, it could still deliver.
	testwait.Eventually(t, "the replay's tap to stop", func() bool { return b.deliv.taps.Load() == 0 })
	if taps := clientTaps(t, b, "unsub"); len(taps) != 0 {
		t.Fatalf("taps %v left after unsubscribing", taps)
	}
	// A record on the replay's filter, then one on the other subscription:
	// the second is the first thing the client gets.
	store(t, s, []string{"t/b"}, nil)
	expectNext(t, c, s, "m/marker")
}

// A replay never has more unacknowledged QoS 1 deliveries than the client's
// Receive Maximum, and goes on as the client acknowledges.
func TestReplay_KeepsTheClientsReceiveMaximum(t *testing.T) {
	l := newMemLog(t, "default=#")
	store(t, l.stream(t, "default"), topicsN("t", 0, 50), nil)
	b := newTestBroker(t, l, func(c *Config) { c.QueueDepth = 44 })
	conn := rawConnect("slow", 5)
	conn.Properties.ReceiveMaximum = 5
	c := mqtttest.Dial(t, b.Addr().String(), conn)
	c.Subscribe("$replay/earliest/+/#", 1)
	var held []packets.Packet
	for range 5 {
		held = append(held, c.Read())
	}
	// The sender holds the sixth record, parked until an acknowledgement
	// opens the window, and the tap queues the other 44. Then only 5 were
	// written, and nothing comes before the PINGRESP either.
	cl, _ := b.srv.Clients.Get("slow")
	dc := b.deliv.client(cl)
	testwait.Eventually(t, "the sender to wait for the window, the queue full", func() bool {
		return len(dc.queue) == cap(dc.queue) && parkedIn("(*deliveryClient).waitWindow")
	})
	if n := metricValue(b.deliv.m.Delivered.WithLabelValues("default")); n != 5 {
		t.Fatalf("%v records written to a client with Receive Maximum 5 and none acknowledged", n)
	}
	acksRead(t, c)
	for _, pk := range held {
		c.Puback(pk.PacketID)
	}
	pks := readPublishes(t, c, 45)
	if last := pks[len(pks)-1].TopicName; last != "$replay/earliest/49/t/49" {
		t.Fatalf("last delivery %q, want offset 49", last)
	}
}

// History and live are one cursor: a replay that starts while a publisher
// is publishing gets every offset exactly once, in order (paho, MQTT 3.1.1).
func TestReplay_GaplessHandOverWhilePublishing(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l)
	const total = 3000
	pub, _ := dialV3(t, b, "pub")
	published := make(chan error, 1)
	go func() {
		for i := range total {
			if tok := pub.Publish(fmt.Sprintf("load/%d", i), 1, false, "x"); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
				published <- fmt.Errorf("publish %d: %v", i, tok.Error())
				return
			}
		}
		published <- nil
	}()
	l.stream(t, "default").waitRecords(t, total/3) // subscribe mid-stream

	var mu sync.Mutex
	var got []string
	arrived := make(chan struct{}, 1)
	sub, _ := dialV3(t, b, "sub")
	tok := sub.Subscribe("$replay/earliest/+/load/#", 1, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		got = append(got, m.Topic())
		mu.Unlock()
		select {
		case arrived <- struct{}{}:
		default:
		}
	})
	if !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	// One more record after the last: in an ordered stream, a duplicate or
	// anything left would show before it.
	if tok := pub.Publish("load/end", 1, false, "x"); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	end := fmt.Sprintf("$replay/earliest/%d/load/end", total)
	testwait.Eventually(t, "the last record", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && got[len(got)-1] == end
	})
	mu.Lock()
	defer mu.Unlock()
	if len(got) != total+1 {
		t.Fatalf("got %d deliveries, want %d", len(got), total+1)
	}
	for i, topic := range got[:total] {
		if want := fmt.Sprintf("$replay/earliest/%d/load/%d", i, i); topic != want {
			t.Fatalf("delivery %d: %q, want %q", i, topic, want)
		}
	}
}

// A client that sets Request Problem Information to 0 (paho.golang does
// whenever it sends CONNECT properties) still gets a replay's user
// properties: [MQTT-3.1.2-29] allows them on PUBLISH.
func TestReplay_PropertiesWithoutProblemInfo(t *testing.T) {
	l := newMemLog(t, "default=#")
	store(t, l.stream(t, "default"), []string{"t/0"}, nil)
	b := newTestBroker(t, l)
	conn := rawConnect("quiet", 5)
	conn.Properties.RequestProblemInfoFlag, conn.Properties.RequestProblemInfo = true, 0
	c := mqtttest.Dial(t, b.Addr().String(), conn)
	c.Subscribe("$replay/earliest/+/t/#", 1)
	pk := readPublishes(t, c, 1)[0]
	if userProp(pk.Properties, propOffset) != "0" || userProp(pk.Properties, propStream) != "default" {
		t.Fatalf("user properties %v, want stream and offset", pk.Properties.User)
	}
}

// subscribeAsking subscribes c to filter, asking for each record's
// publisher (the SUBSCRIBE's user property client "true"), and returns the
// SUBACK.
func subscribeAsking(tb testing.TB, c *mqtttest.Raw, filter string) packets.Packet {
	tb.Helper()
	c.Write(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		PacketID:    7,
		Filters:     packets.Subscriptions{{Filter: filter, Qos: 1}},
		Properties:  packets.Properties{User: []packets.UserProperty{{Key: propClient, Val: "true"}}},
	})
	ack := c.ReadUntil(packets.Suback)
	if len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] > 2 {
		tb.Fatalf("subscribe %s: %v %s", filter, ack.ReasonCodes, ack.Properties.ReasonString)
	}
	return ack
}

// A $replay or $group delivery shows the record's publisher (user property
// client, after timestamp) only to a subscriber that asked for it, and
// under Auth only for the client ids its Access lets it see; an ordinary
// $replay consumer gets the stream, offset and timestamp properties as
// before.
func TestReplay_PublishersClientIDOnlyWhenAskedAndAllowed(t *testing.T) {
	recs := func() []*logstore.Record {
		return []*logstore.Record{
			{Topic: "t/0", Payload: []byte("a"), QoS: 1, ClientID: "hq-sensor-1", Timestamp: 1000},
			{Topic: "t/1", Payload: []byte("b"), QoS: 1, ClientID: "other-2", Timestamp: 2000},
			{Topic: "t/2", Payload: []byte("c"), QoS: 1, Timestamp: 3000}, // no publisher (a source's record)
		}
	}
	setup := func(t *testing.T, auth Auth) *Broker {
		l := newMemLog(t, "default=#")
		s := l.stream(t, "default")
		done := make(chan error, 1)
		s.AppendAsync(recs(), func(_ uint64, err error) { done <- err })
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return newTestBroker(t, l, func(c *Config) {
			if auth != nil {
				c.Auth = auth
			}
		})
	}
	// lastKeys is the keys of a delivery's last user properties.
	lastKeys := func(pk packets.Packet, n int) []string {
		u := pk.Properties.User
		var out []string
		for _, p := range u[max(len(u)-n, 0):] {
			out = append(out, p.Key)
		}
		return out
	}
	check := func(t *testing.T, pks []packets.Packet, want []string) {
		t.Helper()
		for i, pk := range pks {
			got := ""
			if keys := lastKeys(pk, 1); len(keys) == 1 && keys[0] == propClient {
				got = pk.Properties.User[len(pk.Properties.User)-1].Val
				if k := lastKeys(pk, 2)[0]; k != propTimestamp {
					t.Errorf("delivery %d: client follows %q, want timestamp", i, k)
				}
			} else if k := lastKeys(pk, 3); !slices.Equal(k, []string{propStream, propOffset, propTimestamp}) {
				t.Errorf("delivery %d: last properties %v, want stream, offset, timestamp", i, k)
			}
			if got != want[i] {
				t.Errorf("delivery %d (%s): client %q, want %q", i, pk.TopicName, got, want[i])
			}
		}
	}

	t.Run("not asked", func(t *testing.T) {
		b := setup(t, nil)
		c := dialRaw(t, b, "plain", 5)
		if ack := c.Subscribe("$replay/earliest/+/t/#", 1); userProp(ack.Properties, propClient) != "" {
			t.Errorf("SUBACK %v: client without asking", ack.Properties.User)
		}
		check(t, readPublishes(t, c, 3), []string{"", "", ""})
	})
	t.Run("asked, no auth", func(t *testing.T) {
		b := setup(t, nil)
		c := dialRaw(t, b, "asker", 5)
		if ack := subscribeAsking(t, c, "$replay/earliest/+/t/#"); userProp(ack.Properties, propClient) != "true" {
			t.Errorf("SUBACK %v, want client true", ack.Properties.User)
		}
		check(t, readPublishes(t, c, 3), []string{"hq-sensor-1", "other-2", ""})
	})
	t.Run("asked, group", func(t *testing.T) {
		b := setup(t, nil)
		c := dialRaw(t, b, "grouper", 5)
		subscribeAsking(t, c, "$group/g/+/t/#")
		check(t, readPublishes(t, c, 3), []string{"hq-sensor-1", "other-2", ""})
	})
	t.Run("asked, the ACL shows some", func(t *testing.T) {
		a := secretAuth()
		a.clientIDs = func(id string) bool { return strings.HasPrefix(id, "hq-") }
		b := setup(t, a)
		c := dialRaw(t, b, "site", 5)
		subscribeAsking(t, c, "$replay/earliest/+/t/#")
		check(t, readPublishes(t, c, 3), []string{"hq-sensor-1", "", ""})
	})
	t.Run("asked, the ACL shows none", func(t *testing.T) {
		b := setup(t, secretAuth())
		c := dialRaw(t, b, "nosy", 5)
		subscribeAsking(t, c, "$replay/earliest/+/t/#")
		check(t, readPublishes(t, c, 3), []string{"", "", ""})
	})
}

// A durable session keeps a $replay subscription's request for
// publishers: after a reconnect with Clean Start 0, its deliveries still
// show them, on a broker restarted meanwhile too.
func TestReplay_PublishersKeptByADurableSession(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	done := make(chan error, 1)
	s.AppendAsync([]*logstore.Record{
		{Topic: "t/0", Payload: []byte("a"), QoS: 1, ClientID: "hq-sensor-1", Timestamp: 1000},
		{Topic: "t/1", Payload: []byte("b"), QoS: 1, ClientID: "other-2", Timestamp: 2000},
		{Topic: "t/2", Payload: []byte("c"), QoS: 1, ClientID: "third-3", Timestamp: 3000},
	}, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	connect := mqtttest.Connect{ClientID: "durable", Version: 5, Keepalive: 60,
		Properties: packets.Properties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true}}
	clientOf := func(pk packets.Packet) string {
		if u := pk.Properties.User; len(u) > 0 && u[len(u)-1].Key == propClient {
			return u[len(u)-1].Val
		}
		return ""
	}

	b := newTestBroker(t, l)
	c := mqtttest.Dial(t, b.Addr().String(), connect)
	subscribeAsking(t, c, "$replay/earliest/+/t/#")
	if got := clientOf(readPublishes(t, c, 1)[0]); got != "hq-sensor-1" {
		t.Fatalf("first delivery: client %q, want hq-sensor-1", got)
	}
	c.Ping()
	c.ReadUntil(packets.Pingresp) // the PUBACK is in
	c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	c.Close()

	c = mqtttest.Dial(t, b.Addr().String(), connect)
	if !c.Connack.SessionPresent {
		t.Fatal("the session did not resume")
	}
	if got := clientOf(readPublishes(t, c, 1)[0]); got != "other-2" {
		t.Errorf("after a reconnect: client %q, want other-2", got)
	}
	c.Ping()
	c.ReadUntil(packets.Pingresp)
	c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	c.Close()

	b = restartBroker(t, b, l)
	c = mqtttest.Dial(t, b.Addr().String(), connect)
	if !c.Connack.SessionPresent {
		t.Fatal("the session did not resume after a restart")
	}
	if got := clientOf(readPublishes(t, c, 1)[0]); got != "third-3" {
		t.Errorf("after a restart: client %q, want third-3", got)
	}
}
