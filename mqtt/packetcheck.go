package mqtt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	"github.com/mochi-mqtt/server/v2/packets"
)

// The connection guard checks the structure of every packet a client
// sends before mochi decodes it (connframe.go collects the bytes). mochi's
// decoders index past the end of some malformed packets (a SUBSCRIBE
// without its options byte, say) and panic on the client's goroutine; what
// passes these checks is what the MQTT 3.1.1 and 5 specifications call
// well-formed, so mochi never sees anything else. The checks read, never
// allocate for the client: each is a pass over bytes already in memory.

// packetCheck reads one packet's body. Its methods record the first
// problem in ref and then return zero values, so a check reads as a
// straight sequence of fields.
type packetCheck struct {
	b   []byte
	off int
	ref *refusal
	v5  bool
}

func (c *packetCheck) fail(ref *refusal) {
	if c.ref == nil {
		c.ref = ref
	}
}

func (c *packetCheck) malformed(format string, args ...any) {
	c.fail(malformed(fmt.Sprintf(format, args...)))
}

func (c *packetCheck) protocol(format string, args ...any) {
	c.fail(protocolError(fmt.Sprintf(format, args...)))
}

func (c *packetCheck) left() int { return len(c.b) - c.off }

func (c *packetCheck) byte1(what string) byte {
	if c.ref != nil {
		return 0
	}
	if c.left() < 1 {
		c.malformed("%s missing", what)
		return 0
	}
	c.off++
	return c.b[c.off-1]
}

func (c *packetCheck) uint16(what string) uint16 {
	if c.ref != nil {
		return 0
	}
	if c.left() < 2 {
		c.malformed("%s missing", what)
		return 0
	}
	c.off += 2
	return binary.BigEndian.Uint16(c.b[c.off-2:])
}

func (c *packetCheck) uint32(what string) uint32 {
	if c.ref != nil {
		return 0
	}
	if c.left() < 4 {
		c.malformed("%s missing", what)
		return 0
	}
	c.off += 4
	return binary.BigEndian.Uint32(c.b[c.off-4:])
}

// binary reads MQTT Binary Data: a two-byte length and that many bytes.
// Names are put together only for a refusal: this runs for every PUBLISH.
func (c *packetCheck) binary(what string) []byte {
	if c.ref != nil {
		return nil
	}
	if c.left() < 2 {
		c.malformed("%s length missing", what)
		return nil
	}
	n := int(binary.BigEndian.Uint16(c.b[c.off:]))
	c.off += 2
	if c.left() < n {
		c.malformed("%s runs past the packet", what)
		return nil
	}
	c.off += n
	return c.b[c.off-n : c.off]
}

// string reads an MQTT UTF-8 Encoded String: well-formed UTF-8 without
// U+0000 [MQTT-1.5.4-1] [MQTT-1.5.4-2].
func (c *packetCheck) string(what string) []byte {
	s := c.binary(what)
	if c.ref == nil && (!utf8.Valid(s) || bytes.IndexByte(s, 0) >= 0) {
		c.malformed("%s is not valid UTF-8", what)
	}
	return s
}

// varint reads a Variable Byte Integer of at most four bytes.
func (c *packetCheck) varint(what string) int {
	v, mult := 0, 1
	for i := 0; i < 4; i++ {
		b := c.byte1(what)
		if c.ref != nil {
			return 0
		}
		v += int(b&127) * mult
		if b&128 == 0 {
			return v
		}
		mult *= 128
	}
	c.malformed("%s longer than 4 bytes", what)
	return 0
}

// The property sets a client may send, by where they stand (MQTT 5
// section 2.2.2.2, table 2-4, client to server only).
const (
	inConnect = 1 << iota
	inWill
	inPublish
	inAck // PUBACK, PUBREC, PUBREL, PUBCOMP
	inSubscribe
	inUnsubscribe
	inDisconnect
)

// propKind is how a property's value is encoded.
type propKind uint8

const (
	propByte propKind = iota
	propUint16
	propUint32
	propVarint
	propString
	propBinary
	propPair
)

type propSpec struct {
	name  string
	kind  propKind
	where int
}

var propSpecs = map[byte]propSpec{
	packets.PropPayloadFormat:          {"Payload Format Indicator", propByte, inPublish | inWill},
	packets.PropMessageExpiryInterval:  {"Message Expiry Interval", propUint32, inPublish | inWill},
	packets.PropContentType:            {"Content Type", propString, inPublish | inWill},
	packets.PropResponseTopic:          {"Response Topic", propString, inPublish | inWill},
	packets.PropCorrelationData:        {"Correlation Data", propBinary, inPublish | inWill},
	packets.PropSubscriptionIdentifier: {"Subscription Identifier", propVarint, inSubscribe},
	packets.PropSessionExpiryInterval:  {"Session Expiry Interval", propUint32, inConnect | inDisconnect},
	packets.PropAuthenticationMethod:   {"Authentication Method", propString, inConnect},
	packets.PropAuthenticationData:     {"Authentication Data", propBinary, inConnect},
	packets.PropRequestProblemInfo:     {"Request Problem Information", propByte, inConnect},
	packets.PropWillDelayInterval:      {"Will Delay Interval", propUint32, inWill},
	packets.PropRequestResponseInfo:    {"Request Response Information", propByte, inConnect},
	packets.PropServerReference:        {"Server Reference", propString, inDisconnect},
	packets.PropReasonString:           {"Reason String", propString, inAck | inDisconnect},
	packets.PropReceiveMaximum:         {"Receive Maximum", propUint16, inConnect},
	packets.PropTopicAliasMaximum:      {"Topic Alias Maximum", propUint16, inConnect},
	packets.PropTopicAlias:             {"Topic Alias", propUint16, inPublish},
	packets.PropUser:                   {"User Property", propPair, inConnect | inWill | inPublish | inAck | inSubscribe | inUnsubscribe | inDisconnect},
	packets.PropMaximumPacketSize:      {"Maximum Packet Size", propUint32, inConnect},
}

// props is what a check needs of a packet's properties.
type props struct {
	topicAlias    uint16 // 0: none
	hasAlias      bool
	subID         bool // a Subscription Identifier was given
	authMethod    bool
	authData      bool
	subscriptions int
}

// properties reads an MQTT 5 property list standing in where: each
// property allowed there, at most once but User Property (and for a
// SUBSCRIBE, one Subscription Identifier) [MQTT-2.2.2-2], with a value in
// its range, and the list ending exactly at its announced length.
func (c *packetCheck) properties(where int, pkt string) props {
	var p props
	n := c.varint("property length")
	if c.ref != nil {
		return p
	}
	if c.left() < n {
		c.malformed("%s properties run past the packet", pkt)
		return p
	}
	end := c.off + n
	sub := packetCheck{b: c.b[:end], off: c.off, v5: true}
	var seen [256]bool
	for sub.ref == nil && sub.off < end {
		id := sub.byte1("property identifier")
		spec, ok := propSpecs[id]
		if !ok || spec.where&where == 0 {
			sub.protocol("property 0x%02x not allowed in %s", id, pkt)
			break
		}
		if seen[id] && id != packets.PropUser {
			sub.protocol("%s given twice in %s", spec.name, pkt)
			break
		}
		seen[id] = true
		sub.propertyValue(id, spec, &p)
	}
	c.fail(sub.ref)
	c.off = end
	return p
}

// propertyValue reads one property's value and checks its range.
func (c *packetCheck) propertyValue(id byte, spec propSpec, p *props) {
	switch spec.kind {
	case propByte:
		if v := c.byte1(spec.name); v > 1 {
			c.protocol("%s %d, want 0 or 1", spec.name, v)
		}
	case propUint16:
		v := c.uint16(spec.name)
		switch {
		case c.ref != nil:
		case id == packets.PropTopicAlias:
			p.topicAlias, p.hasAlias = v, true
		case id == packets.PropReceiveMaximum && v == 0:
			c.protocol("Receive Maximum 0")
		}
	case propUint32:
		if v := c.uint32(spec.name); c.ref == nil && id == packets.PropMaximumPacketSize && v == 0 {
			c.protocol("Maximum Packet Size 0")
		}
	case propVarint:
		if v := c.varint(spec.name); c.ref == nil && v == 0 {
			c.protocol("Subscription Identifier 0") // [MQTT-3.8.2.1.2]
		}
		p.subID = true
	case propString:
		if s := c.string(spec.name); c.ref == nil && id == packets.PropResponseTopic {
			c.fail(checkTopicName(s, "Response Topic")) // [MQTT-3.3.2-14]
		}
		p.authMethod = p.authMethod || id == packets.PropAuthenticationMethod
	case propBinary:
		c.binary(spec.name)
		p.authData = p.authData || id == packets.PropAuthenticationData
	case propPair:
		c.string(spec.name + " name")
		c.string(spec.name + " value")
	}
}

// checkTopicName checks a topic name's content: at least one character
// [MQTT-4.7.3-1], no wildcard [MQTT-3.3.2-2]. UTF-8 is checked where it
// is read.
func checkTopicName(s []byte, what string) *refusal {
	switch {
	case len(s) == 0:
		return protocolError(what + " is empty")
	case bytes.IndexByte(s, '+') >= 0 || bytes.IndexByte(s, '#') >= 0:
		return &refusal{
			err:    fmt.Errorf("%w: %s %q", ErrTopicInvalid, what, s),
			reason: ReasonTopicInvalid,
			code:   packets.Code{Code: packets.ErrTopicNameInvalid.Code, Reason: what + " contains a wildcard"},
		}
	}
	return nil
}

// protocolError is the refusal of a Protocol Error (MQTT 5 reason 0x82):
// a well-framed packet that breaks a rule of the protocol.
func protocolError(what string) *refusal {
	return &refusal{
		err:    fmt.Errorf("%w: %s", ErrProtocolError, what),
		reason: ReasonMalformed,
		code:   packets.Code{Code: packets.ErrProtocolViolation.Code, Reason: what},
	}
}

// end fails unless the whole body was read.
func (c *packetCheck) end(pkt string) {
	if c.ref == nil && c.left() != 0 {
		c.malformed("%d bytes after the end of the %s", c.left(), pkt)
	}
}
