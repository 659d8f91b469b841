package mqttsink

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// mochiPublish is the PUBLISH mochi's encoder makes of r: what the sink
// sent before it encoded by hand.
func mochiPublish(t *testing.T, u *Upstream, stream string, r *logstore.Record, pid uint16) []byte {
	t.Helper()
	topic := strings.NewReplacer("{stream}", stream, "{node}", u.cfg.Node, "{topic}", r.Topic).Replace(u.cfg.Topic)
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: u.cfg.QoS, Retain: r.Retain},
		ProtocolVersion: u.cfg.Version,
		TopicName:       topic,
		PacketID:        pid,
		Payload:         r.Payload,
	}
	if u.cfg.Version == 5 {
		pk.Mods.AllowResponseInfo = true
		p := packets.Properties{ContentType: r.ContentType, ResponseTopic: r.ResponseTopic, CorrelationData: r.CorrelationData}
		if r.PayloadFormat != nil {
			p.PayloadFormat, p.PayloadFormatFlag = *r.PayloadFormat, true
		}
		if left, _ := r.ExpiryLeft(time.Now().UnixMilli()); left > 0 {
			p.MessageExpiryInterval = left
		}
		for _, up := range r.UserProperties {
			p.User = append(p.User, packets.UserProperty{Key: up.Key, Val: up.Value})
		}
		if u.cfg.Properties {
			p.User = append(p.User, packets.UserProperty{Key: PropStream, Val: stream},
				packets.UserProperty{Key: PropOffset, Val: strconv.FormatUint(r.Offset, 10)},
				packets.UserProperty{Key: PropTime, Val: strconv.FormatInt(r.Timestamp, 10)})
		}
		if u.cfg.Extra != nil {
			p.User = append(p.User, u.cfg.Extra(stream, r)...)
		}
		pk.Properties = p
	}
	var buf bytes.Buffer
	if err := pk.PublishEncode(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestAppendPublish_SameBytesAsMochi: the hand-written encoder makes the
// bytes mochi's does, for both versions, both QoS, topic templates, every
// property a record keeps, the peat properties and Extra's, and a payload
// long enough for a multi-byte remaining length.
func TestAppendPublish_SameBytesAsMochi(t *testing.T) {
	format := byte(1)
	big := bytes.Repeat([]byte("x"), 300)
	records := map[string]*logstore.Record{
		"bare":   {Offset: 7, Timestamp: 1700000000000, Topic: "sensors/a", Payload: []byte("21.5")},
		"empty":  {Offset: 0, Topic: "a"},
		"retain": {Offset: 1 << 40, Timestamp: 1, Topic: "t/r", Retain: true, Payload: big},
		"huge":   {Offset: 3, Topic: "t", Payload: bytes.Repeat([]byte("y"), 20000)},
		"all": {Offset: 12345, Timestamp: time.Now().UnixMilli(), Topic: "meters/m1/power", Payload: []byte("{}"),
			ContentType: "application/json", PayloadFormat: &format, ResponseTopic: "replies/1",
			CorrelationData: []byte{0, 1, 2}, MessageExpiry: 3600,
			UserProperties: []logstore.UserProperty{{Key: "unit", Value: "W"}, {Key: "unit", Value: "kW"}, {Key: "", Value: ""}}},
		"wildcard response topic": {Topic: "x", ResponseTopic: "replies/#"},
	}
	extra := func(stream string, r *logstore.Record) []packets.UserProperty {
		return []packets.UserProperty{{Key: "peat-mirror-topic", Val: stream + "/" + r.Topic}}
	}
	for _, c := range []Config{
		{Version: 5, QoS: 1},
		{Version: 5, QoS: 2, Properties: true, Topic: "site-a/{node}/{stream}/{topic}", Node: "pi"},
		{Version: 5, QoS: 1, Topic: "{topic}/x{stream}", Extra: extra},
		{Version: 4, QoS: 1, Topic: "up/{topic}"},
		{Version: 4, QoS: 2},
	} {
		c.URL = "mqtt://127.0.0.1:1883"
		u, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		var props []byte
		for name, r := range records {
			got, err := u.appendPublish([]byte{0xEE}, &props, "default", r, 513)
			if err != nil {
				t.Fatalf("v%d %s: %v", c.Version, name, err)
			}
			if want := mochiPublish(t, u, "default", r, 513); !bytes.Equal(got[1:], want) {
				t.Errorf("v%d qos %d topic %q, record %s:\n got %x\nwant %x", c.Version, c.QoS, c.Topic, name, got[1:], want)
			}
			if got[0] != 0xEE {
				t.Errorf("appendPublish overwrote what b held")
			}
		}
	}
}

// An over-long string is refused, not cut short as mochi's encoder does.
func TestAppendPublish_RefusesOverlongStrings(t *testing.T) {
	u, err := New(Config{URL: "mqtt://127.0.0.1:1883", Version: 5, QoS: 1})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", 70000)
	var props []byte
	for name, r := range map[string]*logstore.Record{
		"topic":         {Topic: long},
		"content type":  {Topic: "t", ContentType: long},
		"user property": {Topic: "t", UserProperties: []logstore.UserProperty{{Key: "k", Value: long}}},
	} {
		if _, err := u.appendPublish(nil, &props, "default", r, 1); err == nil {
			t.Errorf("%s of 70000 bytes encoded", name)
		}
	}
}
