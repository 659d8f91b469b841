package mqtt

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// mochiPublish is what mochi's WritePacket would send for pk.
func mochiPublish(tb testing.TB, pk packets.Packet, v5 bool) []byte {
	tb.Helper()
	pk.ProtocolVersion = 4
	if v5 {
		pk.ProtocolVersion = 5
	}
	pk.Mods.AllowResponseInfo = true // WritePacket sets it for every packet but CONNACK
	var buf bytes.Buffer
	if err := pk.PublishEncode(&buf); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func publishFixtures() map[string]packets.Packet {
	pf := byte(1)
	return map[string]packets.Packet{
		"qos0": {FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "sensors/a", Payload: []byte("21.5")},
		"qos1 retain": {FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
			TopicName: "$replay/earliest/17/sensors/a", PacketID: 7, Payload: []byte{0, 1, 2}},
		"qos2 dup": {FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2, Dup: true},
			TopicName: "a", PacketID: 65535},
		"empty payload": {FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "t"},
		"long payload": {FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1,
			TopicName: "big", Payload: bytes.Repeat([]byte("x"), 20000)},
		"every property": {FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 300,
			TopicName: "meters/1/power", Payload: []byte("{}"),
			Properties: packets.Properties{
				PayloadFormat: pf, PayloadFormatFlag: true,
				MessageExpiryInterval:  60,
				ContentType:            "application/json",
				ResponseTopic:          "replies/1",
				CorrelationData:        []byte("abc"),
				SubscriptionIdentifier: []int{1, 0, 300, 2097152},
				TopicAlias:             3, TopicAliasFlag: true,
				User: []packets.UserProperty{{Key: "stream", Val: "default"}, {Key: "offset", Val: "12"}, {Key: "", Val: ""}},
			}},
		"message expiry only": {FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 9,
			TopicName: "e", Payload: []byte("x"), Properties: packets.Properties{MessageExpiryInterval: 1<<32 - 1}},
		"wildcard response topic": {FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "t",
			Properties: packets.Properties{ResponseTopic: "replies/#"}},
	}
}

func TestAppendPublish_SameBytesAsMochi(t *testing.T) {
	for name, pk := range publishFixtures() {
		for _, v5 := range []bool{false, true} {
			got := appendPublish(nil, &pk, nil, v5, true)
			if want := mochiPublish(t, pk, v5); !bytes.Equal(got, want) {
				t.Errorf("%s (v5 %v):\n got  % x\n want % x", name, v5, got, want)
			}
		}
	}
}

// An extension subscription's extras encode as the packet they stand for.
func TestAppendPublish_ExtrasSameBytesAsApplied(t *testing.T) {
	extras := []publishExtras{
		{head: "$replay/earliest/", stream: "default", offset: 0, timestamp: 1764680000000},
		{head: "$group/billing/", stream: "power", offset: 1<<64 - 1, timestamp: -1},
		{head: "$replay/-15m/", stream: "", offset: 1234567, timestamp: 0},
		{head: "$replay/earliest/", stream: "default", offset: 9, timestamp: 1764680000000, client: "hq-sensor-1"},
	}
	for name, pk := range publishFixtures() {
		for _, x := range extras {
			for _, v5 := range []bool{false, true} {
				for _, withUser := range []bool{false, true} {
					got := appendPublish(nil, &pk, &x, v5, withUser)
					applied := x.apply(pk, v5)
					if !withUser {
						applied.Properties.User = nil
					}
					if want := mochiPublish(t, applied, v5); !bytes.Equal(got, want) {
						t.Errorf("%s, %+v (v5 %v, user properties %v):\n got  % x\n want % x", name, x, v5, withUser, got, want)
					}
				}
			}
		}
	}
	pk := publishFixtures()["qos0"]
	x := extras[0]
	applied := x.apply(pk, true)
	if applied.TopicName != "$replay/earliest/0/sensors/a" {
		t.Errorf("topic %q", applied.TopicName)
	}
	if u := applied.Properties.User; len(u) != 3 || u[0].Val != "default" || u[1].Val != "0" || u[2].Val != "1764680000000" {
		t.Errorf("user properties %+v", u)
	}
}

func TestAppendPublish_DecodesAsSent(t *testing.T) {
	pk := publishFixtures()["every property"]
	enc := appendPublish([]byte("kept"), &pk, nil, true, true)
	if !bytes.HasPrefix(enc, []byte("kept")) {
		t.Fatalf("appendPublish overwrote what dst held: % x", enc[:4])
	}
	enc = enc[4:]
	var got packets.Packet
	got.ProtocolVersion = 5
	if err := got.FixedHeader.Decode(enc[0]); err != nil {
		t.Fatal(err)
	}
	length, n, err := packets.DecodeLength(bytes.NewReader(enc[1:]))
	if err != nil {
		t.Fatal(err)
	}
	body := enc[1+n:]
	if length != len(body) {
		t.Fatalf("remaining length %d, body %d bytes", length, len(body))
	}
	if err := got.PublishDecode(body); err != nil {
		t.Fatal(err)
	}
	if got.TopicName != pk.TopicName || got.PacketID != pk.PacketID || !bytes.Equal(got.Payload, pk.Payload) ||
		got.Properties.ContentType != pk.Properties.ContentType || len(got.Properties.User) != len(pk.Properties.User) ||
		got.Properties.User[1] != pk.Properties.User[1] {
		t.Errorf("decoded %+v\nsent %+v", got, pk)
	}
}

func TestAppendPublish_WithoutUserProperties(t *testing.T) {
	pk := publishFixtures()["every property"]
	with := appendPublish(nil, &pk, nil, true, true)
	without := appendPublish(nil, &pk, nil, true, false)
	pk.Properties.User = nil
	if want := mochiPublish(t, pk, true); !bytes.Equal(without, want) {
		t.Errorf("without user properties:\n got  % x\n want % x", without, want)
	}
	if len(without) >= len(with) {
		t.Errorf("leaving user properties out did not shrink the packet: %d >= %d", len(without), len(with))
	}
}

// FuzzAppendPublish checks the encoder against mochi's for arbitrary topics,
// payloads, flags and properties, the Message Expiry Interval among them.
func FuzzAppendPublish(f *testing.F) {
	f.Add("sensors/a", []byte("1"), byte(1), true, uint16(5), "text/plain", "k", "v", 200, uint32(60), true)
	f.Add("", []byte{}, byte(0), false, uint16(0), "", "", "", 0, uint32(0), false)
	f.Add(strings.Repeat("t/", 100), bytes.Repeat([]byte{0xff}, 300), byte(2), true, uint16(65535), "ct", "", "", 1<<20, uint32(1<<32-1), true)
	f.Add("e", []byte("x"), byte(0), false, uint16(0), "", "", "", 0, uint32(1), true)
	f.Fuzz(func(t *testing.T, topic string, payload []byte, qos byte, retain bool, id uint16,
		contentType, key, val string, subID int, expiry uint32, v5 bool) {
		qos %= 3
		if qos > 0 && id == 0 {
			id = 1 // mochi refuses QoS > 0 without a packet id; delivery always has one
		}
		if len(topic) > 65535 || len(contentType) > 65535 || len(key) > 65535 || len(val) > 65535 {
			t.Skip("not an MQTT string")
		}
		if subID < 0 || subID > 268435455 {
			subID = 1
		}
		pk := packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: retain},
			TopicName:   topic, PacketID: id, Payload: payload,
			Properties: packets.Properties{ContentType: contentType, SubscriptionIdentifier: []int{subID},
				MessageExpiryInterval: expiry},
		}
		if key != "" || val != "" {
			pk.Properties.User = []packets.UserProperty{{Key: key, Val: val}}
		}
		got := appendPublish(nil, &pk, nil, v5, true)
		if want := mochiPublish(t, pk, v5); !bytes.Equal(got, want) {
			t.Errorf("\n got  % x\n want % x", got, want)
		}
		x := publishExtras{head: "$replay/" + contentType + "/", stream: key, offset: uint64(subID) * 7919, timestamp: int64(id) - 3, client: val}
		if len(x.head)+len(topic)+21 > 65535 || len(x.stream) > 65535 || len(x.client) > 65535 {
			return
		}
		got = appendPublish(nil, &pk, &x, v5, true)
		if want := mochiPublish(t, x.apply(pk, v5), v5); !bytes.Equal(got, want) {
			t.Errorf("with extras %+v:\n got  % x\n want % x", x, got, want)
		}
	})
}

func BenchmarkAppendPublish(b *testing.B) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 0},
		TopicName:   "$replay/earliest/123456/bench/replay/3",
		Payload:     bytes.Repeat([]byte("x"), 128),
		Properties: packets.Properties{User: []packets.UserProperty{
			{Key: "stream", Val: "default"}, {Key: "offset", Val: "123456"}, {Key: "timestamp", Val: "1764680000000"}}},
	}
	b.Run("peat", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = appendPublish(buf[:0], &pk, nil, true, true)
		}
		b.SetBytes(int64(len(buf)))
	})
	b.Run("mochi", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p := pk
			p.ProtocolVersion = 5
			buf := new(bytes.Buffer) // as WritePacket does
			_ = p.PublishEncode(buf)
		}
	})
}

func TestAppendAck_SameBytesAsMochi(t *testing.T) {
	for _, typ := range []byte{packets.Puback, packets.Pubrec} {
		for _, version := range []byte{4, 5} {
			for _, id := range []uint16{1, 0x1234, 65535} {
				pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: typ}, PacketID: id, ProtocolVersion: version}
				var want bytes.Buffer
				if err := pk.PubackEncode(&want); err != nil { // Pubrec shares the encoder
					t.Fatal(err)
				}
				if got := appendAck(nil, typ, id); !bytes.Equal(got, want.Bytes()) {
					t.Errorf("type %d v%d id %d: got % x, want % x", typ, version, id, got, want.Bytes())
				}
			}
		}
	}
}

// apply returns pk with x's topic and user properties in it, as mochi's
// encoder needs them: the packet appendPublish must encode to the same bytes.
func (x *publishExtras) apply(pk packets.Packet, v5 bool) packets.Packet {
	pk.TopicName = string(x.appendTopic(nil, pk.TopicName))
	if v5 {
		user := make([]packets.UserProperty, 0, len(pk.Properties.User)+3)
		user = append(user, pk.Properties.User...)
		pk.Properties.User = append(user,
			packets.UserProperty{Key: propStream, Val: x.stream},
			packets.UserProperty{Key: propOffset, Val: strconv.FormatUint(x.offset, 10)},
			packets.UserProperty{Key: propTimestamp, Val: strconv.FormatInt(x.timestamp, 10)})
		if x.client != "" {
			pk.Properties.User = append(pk.Properties.User, packets.UserProperty{Key: propClient, Val: x.client})
		}
	}
	return pk
}
