package mqtt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// rawPacket is a packet of type typ with flags and body, framed.
func rawPacket(typ, flags byte, body ...[]byte) []byte {
	b := bytes.Join(body, nil)
	out := append([]byte{typ<<4 | flags}, binary.AppendUvarint(nil, uint64(len(b)))...)
	return append(out, b...)
}

// str is an MQTT string or Binary Data: a two-byte length and s.
func str(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }

// propList is an MQTT 5 property list holding b.
func propList(b ...byte) []byte { return append(binary.AppendUvarint(nil, uint64(len(b))), b...) }

// clientFramer is a framer past an accepted CONNECT of version.
func clientFramer(version byte) *framer {
	return &framer{maxConnect: 1 << 16, maxPacket: 1 << 20, seen: 1, version: version,
		aliases: aliasTable{max: DefaultTopicAliases}}
}

// checkOne scans pk, one whole packet, with f and returns its verdict.
func checkOne(f *framer, pk []byte) *refusal {
	_, ref := f.scan(pk)
	if ref == nil && (f.st != stType) {
		return malformed("framer did not end the packet")
	}
	return ref
}

// TestPacketCheck_AcceptsWellFormedPackets: every well-formed packet of
// mochi's own fixtures (3.1, 3.1.1 and 5, every property) that a client
// may send passes the guard; the guard must not refuse a good client.
func TestPacketCheck_AcceptsWellFormedPackets(t *testing.T) {
	clientTypes := []byte{packets.Connect, packets.Publish, packets.Puback, packets.Pubrec, packets.Pubrel,
		packets.Pubcomp, packets.Subscribe, packets.Unsubscribe, packets.Pingreq, packets.Disconnect}
	n := 0
	for _, typ := range clientTypes {
		for _, tc := range packets.TPacketData[typ] {
			if tc.Expect != nil || tc.FailFirst != nil || tc.Packet == nil || len(tc.RawBytes) == 0 ||
				(tc.Group != "" && tc.Group != "decode") {
				continue
			}
			version := tc.Packet.ProtocolVersion
			if version == 0 {
				version = 4
			}
			f := clientFramer(version)
			if typ == packets.Connect {
				f = &framer{maxConnect: 1 << 16, maxPacket: 1 << 20}
			}
			if typ == packets.Publish && tc.Packet.Properties.TopicAliasFlag && tc.Packet.TopicName == "" {
				continue // uses an alias set on the fixture's earlier connection
			}
			var fh packets.FixedHeader
			if fh.Decode(tc.RawBytes[0]) != nil {
				continue // mochi refuses it too: DUP at QoS 0
			}
			if typ == packets.Publish && len(tc.Packet.Properties.SubscriptionIdentifier) > 0 {
				continue // a server's PUBLISH: clients may not send a Subscription Identifier
			}
			// Well-formed, refused for what it asks: Peat does no
			// enhanced authentication (TestGuard_RefusesAuthenticationMethod).
			if ref := checkOne(f, tc.RawBytes); ref != nil && !errors.Is(ref.err, ErrBadAuthMethod) {
				t.Errorf("%s (type %d, v%d): refused: %v", tc.Desc, typ, version, ref.err)
			}
			n++
		}
	}
	if n < 40 {
		t.Fatalf("checked %d fixtures, want at least 40", n)
	}
}

// TestPacketCheck_RefusesMalformedPackets: each packet breaks one rule of
// MQTT 3.1.1 or 5 and is refused with the reason code the specification
// names, whether it arrives whole or a byte at a time.
func TestPacketCheck_RefusesMalformedPackets(t *testing.T) {
	const (
		malformedCode = 0x81
		protocolCode  = 0x82
		aliasCode     = 0x94
	)
	cases := []struct {
		name    string
		version byte
		pk      []byte
		code    byte
	}{
		// mochi v2.7.9's SubscribeDecode indexes past these and panics.
		{"SUBSCRIBE without options byte, empty filter", 5, []byte{0x82, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00}, malformedCode},
		{"SUBSCRIBE without options byte", 5, []byte{0x82, 0x06, 0x00, 0x01, 0x00, 0x00, 0x01, 'a'}, malformedCode},
		{"SUBSCRIBE 3.1.1 without options byte", 4, rawPacket(8, 2, []byte{0, 1}, str("a")), malformedCode},
		{"SUBSCRIBE empty filter", 5, rawPacket(8, 2, []byte{0, 1}, propList(), str(""), []byte{1}), protocolCode},
		{"SUBSCRIBE no filter", 5, rawPacket(8, 2, []byte{0, 1}, propList()), protocolCode},
		{"SUBSCRIBE Retain Handling 3", 5, rawPacket(8, 2, []byte{0, 1}, propList(), str("a"), []byte{0x30}), protocolCode},
		{"SUBSCRIBE reserved option bits", 5, rawPacket(8, 2, []byte{0, 1}, propList(), str("a"), []byte{0x40}), malformedCode},
		{"SUBSCRIBE 3.1.1 reserved option bits", 4, rawPacket(8, 2, []byte{0, 1}, str("a"), []byte{0x04}), malformedCode},
		{"SUBSCRIBE QoS 3", 4, rawPacket(8, 2, []byte{0, 1}, str("a"), []byte{3}), malformedCode},
		{"SUBSCRIBE Subscription Identifier 0", 5, rawPacket(8, 2, []byte{0, 1}, propList(0x0b, 0), str("a"), []byte{1}), protocolCode},
		{"SUBSCRIBE two Subscription Identifiers", 5, rawPacket(8, 2, []byte{0, 1}, propList(0x0b, 1, 0x0b, 2), str("a"), []byte{1}), protocolCode},
		{"SUBSCRIBE No Local on a shared subscription", 5, rawPacket(8, 2, []byte{0, 1}, propList(), str("$share/g/a"), []byte{0x05}), protocolCode},
		{"SUBSCRIBE packet id 0", 5, rawPacket(8, 2, []byte{0, 0}, propList(), str("a"), []byte{1}), protocolCode},
		{"SUBSCRIBE fixed header flags 0000", 5, rawPacket(8, 0, []byte{0, 1}, propList(), str("a"), []byte{1}), malformedCode},
		{"SUBSCRIBE property length past the packet", 5, rawPacket(8, 2, []byte{0, 1}, []byte{9}, str("a"), []byte{1}), malformedCode},
		{"SUBSCRIBE filter not UTF-8", 5, rawPacket(8, 2, []byte{0, 1}, propList(), str("a\xff"), []byte{1}), malformedCode},
		{"UNSUBSCRIBE empty filter", 5, rawPacket(10, 2, []byte{0, 1}, propList(), str("")), protocolCode},
		{"UNSUBSCRIBE no filter", 4, rawPacket(10, 2, []byte{0, 1}), protocolCode},
		{"UNSUBSCRIBE filter past the packet", 5, rawPacket(10, 2, []byte{0, 1}, propList(), []byte{0, 9, 'a'}), malformedCode},
		{"PUBLISH unknown topic alias", 5, rawPacket(3, 2, str(""), []byte{0, 1}, propList(0x23, 0, 7)), protocolCode},
		{"PUBLISH topic alias 0", 5, rawPacket(3, 0, str("a"), propList(0x23, 0, 0)), aliasCode},
		{"PUBLISH topic alias above the maximum", 5, rawPacket(3, 0, str("a"), propList(0x23, 0xff, 0xff)), aliasCode},
		{"PUBLISH empty topic without alias", 5, rawPacket(3, 0, str(""), propList()), protocolCode},
		{"PUBLISH 3.1.1 empty topic", 4, rawPacket(3, 0, str(""), []byte("x")), protocolCode},
		{"PUBLISH Subscription Identifier", 5, rawPacket(3, 0, str("a"), propList(0x0b, 1)), protocolCode},
		{"PUBLISH Payload Format Indicator 2", 5, rawPacket(3, 0, str("a"), propList(0x01, 2)), protocolCode},
		{"PUBLISH Content Type twice", 5, rawPacket(3, 0, str("a"), propList(0x03, 0, 1, 'a', 0x03, 0, 1, 'b')), protocolCode},
		{"PUBLISH Response Topic with a wildcard", 5, rawPacket(3, 0, str("a"), propList(0x08, 0, 1, '#')), packets.ErrTopicNameInvalid.Code},
		{"PUBLISH property runs past its list", 5, rawPacket(3, 0, str("a"), propList(0x02, 0, 0), []byte{0, 0}), malformedCode},
		{"PUBLISH packet id 0", 5, rawPacket(3, 2, str("a"), []byte{0, 0}, propList()), protocolCode},
		{"PUBLISH DUP at QoS 0", 4, rawPacket(3, 8, str("a")), malformedCode},
		{"PUBREL flags 0000", 5, rawPacket(6, 0, []byte{0, 1}), malformedCode},
		{"PUBACK 3.1.1 with a reason code", 4, rawPacket(4, 0, []byte{0, 1, 0}), malformedCode},
		{"PUBACK property list past the packet", 5, rawPacket(4, 0, []byte{0, 1, 0, 5}), malformedCode},
		{"PINGREQ with a body", 4, rawPacket(12, 0, []byte{0}), malformedCode},
		{"DISCONNECT 3.1.1 with a body", 4, rawPacket(14, 0, []byte{0}), malformedCode},
		{"DISCONNECT Receive Maximum", 5, rawPacket(14, 0, []byte{0}, propList(0x21, 0, 1)), protocolCode},
		{"AUTH in 3.1.1", 4, rawPacket(15, 0), malformedCode},
		{"AUTH without an Authentication Method", 5, rawPacket(15, 0), protocolCode},
		{"second CONNECT", 5, rawPacket(1, 0, str("MQTT"), []byte{5, 2, 0, 0}, propList(), str("x")), protocolCode},
		{"CONNACK from a client", 5, rawPacket(2, 0, []byte{0, 0}), protocolCode},
		{"reserved type 0", 5, rawPacket(0, 0), malformedCode},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, chunk := range []int{len(tc.pk), 1} {
				f := clientFramer(tc.version)
				var ref *refusal
				for off := 0; off < len(tc.pk) && ref == nil; off += chunk {
					_, ref = f.scan(tc.pk[off:min(off+chunk, len(tc.pk))])
				}
				if ref == nil {
					t.Fatalf("chunks of %d: % x accepted", chunk, tc.pk)
				}
				if ref.code.Code != tc.code {
					t.Fatalf("chunks of %d: reason 0x%02x (%v), want 0x%02x", chunk, ref.code.Code, ref.err, tc.code)
				}
			}
		})
	}
}

// TestPacketCheck_RefusesMalformedConnect: a CONNECT that breaks the
// format of section 3.1 is refused [MQTT-3.1.4-1].
func TestPacketCheck_RefusesMalformedConnect(t *testing.T) {
	head := func(version, flags byte) []byte { return append(str("MQTT"), version, flags, 0, 0) }
	cases := []struct {
		name string
		body [][]byte
	}{
		{"reserved flag", [][]byte{head(4, 0x01), str("c")}},
		{"will QoS 3", [][]byte{head(4, 0x1c), str("c"), str("w"), str("x")}},
		{"will retain without will", [][]byte{head(4, 0x20), str("c")}},
		{"password without user name in 3.1.1", [][]byte{head(4, 0x40), str("c"), str("p")}},
		{"empty will topic", [][]byte{head(4, 0x04), str("c"), str(""), str("x")}},
		{"will topic with a wildcard", [][]byte{head(4, 0x04), str("c"), str("a/#"), str("x")}},
		{"client id past the packet", [][]byte{head(4, 0x02), []byte{0, 5, 'c'}}},
		{"bytes after the password", [][]byte{head(4, 0xc0), str("c"), str("u"), str("p"), []byte{1}}},
		{"user name without its flag", [][]byte{head(4, 0x00), str("c"), str("u")}},
		{"MQTT 5 Receive Maximum 0", [][]byte{head(5, 0x02), propList(0x21, 0, 0), str("c")}},
		{"MQTT 5 Authentication Data alone", [][]byte{head(5, 0x02), propList(0x16, 0, 1, 'x'), str("c")}},
		{"MQTT 5 will property not a will's", [][]byte{head(5, 0x06), propList(), str("c"), propList(0x11, 0, 0, 0, 1), str("w"), str("x")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &framer{maxConnect: 1 << 16, maxPacket: 1 << 20}
			if _, ref := f.scan(rawPacket(packets.Connect, 0, tc.body...)); ref == nil {
				t.Fatalf("accepted")
			}
		})
	}
	t.Run("empty will payload is valid", func(t *testing.T) {
		f := &framer{maxConnect: 1 << 16, maxPacket: 1 << 20}
		if _, ref := f.scan(rawPacket(packets.Connect, 0, head(4, 0x06), str("c"), str("w"), str(""))); ref != nil {
			t.Fatalf("refused: %v", ref.err)
		}
	})
	t.Run("unknown protocol level is left to mochi", func(t *testing.T) {
		f := &framer{maxConnect: 1 << 16, maxPacket: 1 << 20}
		if _, ref := f.scan(rawPacket(packets.Connect, 0, head(9, 0x02), str("c"))); ref != nil {
			t.Fatalf("refused: %v", ref.err)
		}
	})
}

// TestPacketCheck_TopicAliasSetThenUsed: an alias set by one PUBLISH
// stands for its topic in later ones [MQTT-3.3.2-12].
func TestPacketCheck_TopicAliasSetThenUsed(t *testing.T) {
	f := clientFramer(5)
	set := rawPacket(3, 0, str("a/b"), propList(0x23, 0, 3), []byte("x"))
	use := rawPacket(3, 0, str(""), propList(0x23, 0, 3), []byte("y"))
	for i, pk := range [][]byte{set, use, use} {
		if ref := checkOne(f, pk); ref != nil {
			t.Fatalf("packet %d refused: %v", i, ref.err)
		}
	}
	none := clientFramer(5)
	none.aliases.max = 0
	if ref := checkOne(none, set); ref == nil || ref.code.Code != packets.ErrTopicAliasInvalid.Code {
		t.Fatalf("alias with none offered: %v, want 0x94", ref)
	}
}

// FuzzPacketCheck: whatever bytes a client sends after its CONNECT, the
// guard never panics, and mochi never panics decoding a packet the guard
// let through.
func FuzzPacketCheck(f *testing.F) {
	for typ, cases := range packets.TPacketData {
		for _, tc := range cases {
			if len(tc.RawBytes) > 0 && typ != packets.Connect {
				v := byte(4)
				if tc.Packet != nil && tc.Packet.ProtocolVersion != 0 {
					v = tc.Packet.ProtocolVersion
				}
				f.Add(tc.RawBytes, v)
			}
		}
	}
	f.Add([]byte{0x82, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00}, byte(5))
	f.Fuzz(func(t *testing.T, b []byte, version byte) {
		if version != 5 {
			version = 4
		}
		fr := clientFramer(version)
		for len(b) > 0 {
			start := len(b)
			_, ref := fr.scan(b)
			if ref != nil || fr.st != stType {
				return
			}
			// b holds whole packets the guard accepted: decode the first.
			pk, n := firstPacket(t, b, version)
			decodeLikeMochi(t, pk, version)
			b = b[n:]
			if len(b) >= start {
				t.Fatal("no progress")
			}
			fr = clientFramer(version)
		}
	})
}

// firstPacket splits the first framed packet off b.
func firstPacket(t *testing.T, b []byte, version byte) (packets.Packet, int) {
	pk := packets.Packet{ProtocolVersion: version}
	if err := pk.FixedHeader.Decode(b[0]); err != nil {
		t.Fatalf("accepted a fixed header mochi refuses: %v", err)
	}
	n, used, err := packets.DecodeLength(bytes.NewReader(b[1:]))
	if err != nil {
		t.Fatalf("accepted a length mochi refuses: %v", err)
	}
	pk.FixedHeader.Remaining = n
	end := 1 + used + n
	pk.Payload = b[1+used : end] // the body, for decodeLikeMochi
	return pk, end
}

// decodeLikeMochi decodes pk's body as mochi's Client.ReadPacket does.
func decodeLikeMochi(t *testing.T, pk packets.Packet, version byte) {
	body := append([]byte(nil), pk.Payload...)
	pk.Payload = nil
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("mochi panicked on an accepted v%d packet type %d % x: %v", version, pk.FixedHeader.Type, body, r)
		}
	}()
	var err error
	switch pk.FixedHeader.Type {
	case packets.Publish:
		err = pk.PublishDecode(body)
	case packets.Puback:
		err = pk.PubackDecode(body)
	case packets.Pubrec:
		err = pk.PubrecDecode(body)
	case packets.Pubrel:
		err = pk.PubrelDecode(body)
	case packets.Pubcomp:
		err = pk.PubcompDecode(body)
	case packets.Subscribe:
		err = pk.SubscribeDecode(body)
	case packets.Unsubscribe:
		err = pk.UnsubscribeDecode(body)
	case packets.Pingreq:
		err = pk.PingreqDecode(body)
	case packets.Disconnect:
		err = pk.DisconnectDecode(body)
	case packets.Auth:
		err = pk.AuthDecode(body)
	default:
		err = fmt.Errorf("type %d", pk.FixedHeader.Type)
	}
	if err != nil {
		t.Fatalf("accepted a v%d packet mochi cannot decode: % x: %v", version, body, err)
	}
}

// TestGuard_MalformedPacketsCloseOnlyTheirConnection: the packets that
// panicked mochi's decoder, and the protocol errors MQTT 5 names, close
// the connection that sent them with DISCONNECT and the reason code (an
// MQTT 3.1.1 client without a word), are counted, and leave the broker
// serving everyone else.
func TestGuard_MalformedPacketsCloseOnlyTheirConnection(t *testing.T) {
	l := newMemLog(t, "default=#")
	m := NewMetrics(nil)
	b := newTestBroker(t, l, func(c *Config) { c.Metrics = m })
	bystander := dialRaw(t, b, "bystander", 5)
	bystander.Subscribe("seen/#", 1)

	cases := []struct {
		name string
		pk   []byte
		code byte
	}{
		{"SUBSCRIBE with an empty filter and no options byte", []byte{0x82, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00}, 0x81},
		{"SUBSCRIBE with no options byte", []byte{0x82, 0x06, 0x00, 0x01, 0x00, 0x00, 0x01, 0x61}, 0x81},
		{"UNSUBSCRIBE with an empty filter", rawPacket(10, 2, []byte{0, 1}, propList(), str("")), 0x82},               // [MQTT-4.7.3-1]
		{"SUBSCRIBE with Retain Handling 3", rawPacket(8, 2, []byte{0, 1}, propList(), str("a"), []byte{0x30}), 0x82}, // [MQTT-3.8.3-5]
		{"SUBSCRIBE with Subscription Identifier 0", rawPacket(8, 2, []byte{0, 1}, propList(0x0b, 0), str("a"), []byte{1}), 0x82},
		{"PUBLISH with a topic alias never set", rawPacket(3, 2, str(""), []byte{0, 1}, propList(0x23, 0, 1), []byte("x")), 0x82},
		{"PUBLISH with topic alias 0", rawPacket(3, 2, str("a"), []byte{0, 1}, propList(0x23, 0, 0), []byte("x")), 0x94}, // [MQTT-3.3.2-8]
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, b, fmt.Sprintf("bad-%d", i), 5)
			c.WriteBytes(tc.pk)
			expectPacket(t, c, packets.Disconnect, tc.code)
			expectClosed(t, c)

			v3 := dialRaw(t, b, fmt.Sprintf("bad3-%d", i), 4)
			v3.WriteBytes([]byte{0x82, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00})
			expectBareClose(t, v3)
		})
	}
	if got, want := metricValue(m.Closed.WithLabelValues(ReasonMalformed)), float64(2*len(cases)); got != want {
		t.Fatalf("closed{malformed} = %v, want %v", got, want)
	}
	// The broker still serves: a publish reaches the subscriber that was
	// connected all along.
	pub := dialRaw(t, b, "pub", 5)
	pub.Publish("seen/after", 1, 1, "still here")
	expectPacket(t, pub, packets.Puback, 0)
	if pk := bystander.ReadUntil(packets.Publish); string(pk.Payload) != "still here" {
		t.Fatalf("bystander got %q", pk.Payload)
	}
}

// TestGuard_TopicAliasesOffered: the Topic Alias Maximum the broker
// announces is topic_aliases, and a client that uses an alias when none
// was offered is disconnected with 0x94 [MQTT-3.2.2-17] [MQTT-3.3.2-9].
func TestGuard_TopicAliasesOffered(t *testing.T) {
	byDefault := newTestBroker(t, newMemLog(t, "default=#"))
	if got := dialRaw(t, byDefault, "offered", 5).Connack.Properties.TopicAliasMaximum; got != DefaultTopicAliases {
		t.Fatalf("CONNACK Topic Alias Maximum %d, want topic_aliases' default %d", got, DefaultTopicAliases)
	}
	b := newTestBroker(t, newMemLog(t, "default=#"), func(c *Config) { c.TopicAliases = 0 })
	c := dialRaw(t, b, "aliaser", 5)
	if got := c.Connack.Properties.TopicAliasMaximum; got != 0 {
		t.Fatalf("CONNACK Topic Alias Maximum %d, want 0", got)
	}
	c.WriteBytes(rawPacket(3, 2, str("a"), []byte{0, 1}, propList(0x23, 0, 1), []byte("x")))
	expectPacket(t, c, packets.Disconnect, packets.ErrTopicAliasInvalid.Code)
	expectClosed(t, c)
}
