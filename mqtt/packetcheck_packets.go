package mqtt

import (
	"bytes"
	"fmt"

	"github.com/mochi-mqtt/server/v2/packets"
)

// checkType checks a packet's type: a client's first packet is
// its CONNECT [MQTT-3.1.0-1], and any later one is not [MQTT-3.1.0-2].
func checkType(typ byte, connected bool, version byte) *refusal {
	switch {
	case !connected && typ != packets.Connect:
		return malformed("the first packet is not a CONNECT")
	case connected && typ == packets.Connect:
		return protocolError("a second CONNECT")
	case typ == packets.Reserved, typ == packets.Auth && version != 5:
		return malformed(fmt.Sprintf("reserved packet type %d", typ))
	case typ == packets.Auth:
		// A client may send AUTH only after an Authentication Method in
		// its CONNECT (MQTT 5 section 4.12), and Peat accepts none.
		return protocolError("AUTH: Peat offers no enhanced authentication")
	case typ == packets.Connack, typ == packets.Suback, typ == packets.Unsuback, typ == packets.Pingresp:
		return protocolError(fmt.Sprintf("packet type %d is the server's", typ))
	}
	return nil
}

// checkFlags checks the fixed header's low four bits: reserved, 0010 for
// PUBREL, SUBSCRIBE and UNSUBSCRIBE, 0000 for the rest but PUBLISH
// [MQTT-2.2.2-1] [MQTT-2.2.2-2]; a PUBLISH's QoS is not 3
// [MQTT-3.3.1-4] and its DUP is 0 at QoS 0 [MQTT-3.3.1-2] (mochi closes
// such a connection without a word).
func checkFlags(typ, flags byte) *refusal {
	want := byte(0)
	switch typ {
	case packets.Publish:
		qos, dup := (flags>>1)&3, flags&8 != 0
		switch {
		case qos == 3:
			return malformed("PUBLISH with QoS 3")
		case qos == 0 && dup:
			return malformed("PUBLISH with DUP set at QoS 0")
		}
		return nil
	case packets.Pubrel, packets.Subscribe, packets.Unsubscribe:
		want = 2
	}
	if flags != want {
		return malformed(fmt.Sprintf("fixed header flags %04b on packet type %d, want %04b", flags, typ, want))
	}
	return nil
}

// checkConnect checks a whole CONNECT body and returns its protocol
// level. A protocol name or level Peat does not speak is left to mochi,
// which answers it [MQTT-3.1.2-1] [MQTT-3.1.2-2].
func checkConnect(b []byte) (byte, *refusal) {
	c := packetCheck{b: b}
	name := c.binary("protocol name")
	level := c.byte1("protocol level")
	if c.ref != nil {
		return 0, c.ref
	}
	mqtt := string(name) == "MQTT" && (level == 4 || level == 5)
	if !mqtt && !(string(name) == "MQIsdp" && level == 3) {
		return level, nil
	}
	c.v5 = level == 5
	flags := c.byte1("connect flags")
	will, willQoS, willRetain := flags&0x04 != 0, (flags>>3)&3, flags&0x20 != 0
	user, pass := flags&0x80 != 0, flags&0x40 != 0
	switch {
	case c.ref != nil:
	case flags&1 != 0:
		c.malformed("CONNECT reserved flag set") // [MQTT-3.1.2-3]
	case willQoS == 3:
		c.malformed("will QoS 3") // [MQTT-3.1.2-14]
	case !will && (willQoS != 0 || willRetain):
		c.malformed("will QoS or retain without a will") // [MQTT-3.1.2-13] [MQTT-3.1.2-15]
	case !c.v5 && pass && !user:
		c.malformed("password without a user name") // [MQTT-3.1.2-22]
	}
	c.uint16("keep alive")
	if c.v5 {
		switch p := c.properties(inConnect, "CONNECT"); {
		case c.ref != nil:
		case p.authData && !p.authMethod:
			c.protocol("Authentication Data without an Authentication Method")
		case p.authMethod: // Peat does no enhanced authentication [MQTT-4.12.0-1]
			c.fail(&refusal{err: ErrBadAuthMethod, reason: ReasonBadAuthMethod, code: packets.Code{
				Code: packets.ErrBadAuthenticationMethod.Code, Reason: "no authentication method is supported: use a user name and password"}})
		}
	}
	c.string("client identifier")
	if will {
		if c.v5 {
			c.properties(inWill, "will")
		}
		if topic := c.string("will topic"); c.ref == nil {
			c.fail(checkTopicName(topic, "will topic")) // [MQTT-3.1.3-11]
		}
		c.binary("will payload")
	}
	if user {
		c.string("user name") // [MQTT-3.1.3-11]
	}
	if pass {
		c.binary("password")
	}
	c.end("CONNECT")
	return level, c.ref
}

// checkSubscribe checks a whole SUBSCRIBE body: a packet identifier, at
// least one filter [MQTT-3.8.3-3], each at least one character
// [MQTT-4.7.3-1] and followed by its options byte, whose reserved bits
// are 0 [MQTT-3.8.3-4] [MQTT-3.8.3-5], QoS not 3, Retain Handling not 3,
// No Local not on a shared subscription.
func checkSubscribe(b []byte, v5 bool) *refusal {
	c := packetCheck{b: b, v5: v5}
	c.packetID("SUBSCRIBE")
	if v5 {
		c.properties(inSubscribe, "SUBSCRIBE")
	}
	if c.ref == nil && c.left() == 0 {
		c.protocol("SUBSCRIBE without a topic filter")
	}
	for c.ref == nil && c.left() > 0 {
		filter := c.string("topic filter")
		opts := c.byte1("subscription options")
		switch {
		case c.ref != nil:
		case len(filter) == 0:
			c.protocol("empty topic filter")
		case !v5 && opts&0xfc != 0, v5 && opts&0xc0 != 0:
			c.malformed("reserved bits set in subscription options %08b", opts)
		case opts&3 == 3:
			c.malformed("subscription QoS 3")
		case v5 && (opts>>4)&3 == 3:
			c.protocol("Retain Handling 3")
		case v5 && opts&4 != 0 && bytes.HasPrefix(filter, []byte("$share/")):
			c.protocol("No Local on a shared subscription")
		}
	}
	return c.ref
}

// checkUnsubscribe checks a whole UNSUBSCRIBE body: a packet identifier
// and at least one filter [MQTT-3.10.3-2], none empty [MQTT-4.7.3-1].
func checkUnsubscribe(b []byte, v5 bool) *refusal {
	c := packetCheck{b: b, v5: v5}
	c.packetID("UNSUBSCRIBE")
	if v5 {
		c.properties(inUnsubscribe, "UNSUBSCRIBE")
	}
	if c.ref == nil && c.left() == 0 {
		c.protocol("UNSUBSCRIBE without a topic filter")
	}
	for c.ref == nil && c.left() > 0 {
		if filter := c.string("topic filter"); c.ref == nil && len(filter) == 0 {
			c.protocol("empty topic filter")
		}
	}
	return c.ref
}

// checkAck checks a PUBACK, PUBREC, PUBREL or PUBCOMP body: a packet
// identifier, then in MQTT 5 an optional reason code and properties.
func checkAck(b []byte, v5 bool, name string) *refusal {
	c := packetCheck{b: b, v5: v5}
	c.packetID(name)
	if v5 && c.left() > 0 {
		c.byte1("reason code")
		if c.left() > 0 {
			c.properties(inAck, name)
		}
	}
	c.end(name)
	return c.ref
}

// checkDisconnect checks a DISCONNECT body: empty, or in MQTT 5 a reason
// code and optional properties (MQTT 5 3.14.2.2.1).
func checkDisconnect(b []byte, v5 bool) *refusal {
	c := packetCheck{b: b, v5: v5}
	if v5 && c.left() > 0 {
		c.byte1("reason code")
		if c.left() > 0 {
			c.properties(inDisconnect, "DISCONNECT")
		}
	}
	c.end("DISCONNECT")
	return c.ref
}

// packetID reads a packet identifier, which is never 0 [MQTT-2.2.1-3].
func (c *packetCheck) packetID(pkt string) {
	switch {
	case c.ref != nil:
	case c.left() < 2:
		c.malformed("%s packet identifier missing", pkt)
	case c.b[c.off] == 0 && c.b[c.off+1] == 0:
		c.protocol("%s packet identifier 0", pkt)
	default:
		c.off += 2
	}
}

// checkBody checks the whole body of a packet other than CONNECT and
// PUBLISH.
func checkBody(typ byte, b []byte, v5 bool) *refusal {
	switch typ {
	case packets.Subscribe:
		return checkSubscribe(b, v5)
	case packets.Unsubscribe:
		return checkUnsubscribe(b, v5)
	case packets.Puback:
		return checkAck(b, v5, "PUBACK")
	case packets.Pubrec:
		return checkAck(b, v5, "PUBREC")
	case packets.Pubrel:
		return checkAck(b, v5, "PUBREL")
	case packets.Pubcomp:
		return checkAck(b, v5, "PUBCOMP")
	case packets.Pingreq:
		c := packetCheck{b: b}
		c.end("PINGREQ")
		return c.ref
	case packets.Disconnect:
		return checkDisconnect(b, v5)
	}
	return nil
}

// publishHeaderNeed returns how many bytes of the body must be read to know the
// header's length, or the header's length when done.
func publishHeaderNeed(b []byte, qos byte, v5 bool) (need int, done bool) {
	if len(b) < 2 {
		return 2, false
	}
	end := 2 + (int(b[0])<<8 | int(b[1]))
	if qos > 0 {
		end += 2
	}
	if !v5 {
		return end, true
	}
	// The property length, a Variable Byte Integer, follows.
	n, mult := 0, 1
	for i := 0; i < 4; i++ {
		if len(b) <= end+i {
			return end + i + 1, false
		}
		n += int(b[end+i]&127) * mult
		if b[end+i]&128 == 0 {
			return end + i + 1 + n, true
		}
		mult *= 128
	}
	return end + 4, true // five bytes: checkPublish finds it malformed
}

// aliasTable is the topic aliases a client set on its connection, checked
// as the PUBLISHes that use them arrive.
type aliasTable struct {
	max uint16              // the Topic Alias Maximum the broker announced
	set map[uint16]struct{} // allocated at the first alias
}

// checkPublish checks a PUBLISH's variable header (topic name, packet
// identifier, properties), b, and registers a topic alias it sets. The
// topic name's text was checked as it arrived (checkTopicText).
func checkPublish(b []byte, qos byte, v5 bool, aliases *aliasTable) *refusal {
	c := packetCheck{b: b, v5: v5}
	topic := c.binary("topic name")
	if qos > 0 {
		c.packetID("PUBLISH")
	}
	var p props
	if v5 {
		p = c.properties(inPublish, "PUBLISH")
	}
	c.end("PUBLISH header")
	if c.ref != nil {
		return c.ref
	}
	if p.hasAlias {
		if p.topicAlias == 0 || p.topicAlias > aliases.max {
			return &refusal{
				err:    fmt.Errorf("%w: topic alias %d, at most %d", ErrProtocolError, p.topicAlias, aliases.max),
				reason: ReasonMalformed,
				code: packets.Code{Code: packets.ErrTopicAliasInvalid.Code,
					Reason: fmt.Sprintf("topic alias %d outside 1 to %d", p.topicAlias, aliases.max)},
			} // [MQTT-3.3.2-8] [MQTT-3.3.2-9]
		}
		if len(topic) == 0 {
			if _, ok := aliases.set[p.topicAlias]; !ok {
				return protocolError(fmt.Sprintf("topic alias %d was never set", p.topicAlias))
			}
			return nil
		}
		if aliases.set == nil {
			aliases.set = map[uint16]struct{}{}
		}
		aliases.set[p.topicAlias] = struct{}{}
	}
	if len(topic) == 0 && !p.hasAlias {
		return protocolError("topic name is empty and no Topic Alias stands for it") // [MQTT-3.3.2-1]
	}
	return nil
}
