package mqtt

import (
	"encoding/binary"
	"strconv"
	"strings"
	"sync/atomic"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Delivery encodes its PUBLISH packets, and ingest its successful acks,
// itself instead of going through mochi's Client.WritePacket. mochi v2.7.9 encodes a packet through three
// pooled buffers, a fresh bytes.Buffer per packet, and, for MQTT 5, a check
// of every one of ~25 property kinds against a map-of-maps table whatever
// the packet carries: 28% of a replay's CPU in a profile
// (scripts/bench-results/replay.md). appendPublish writes the same bytes straight into the
// sender's reusable buffer.
//
// It emits the same bytes as mochi's PublishEncode for the packets delivery
// builds (TestAppendPublish_SameBytesAsMochi), with the properties in
// mochi's order, except that user properties are kept for clients that set
// Request Problem Information 0 ([MQTT-3.1.2-29] forbids them only on
// packets other than PUBLISH, CONNACK and DISCONNECT; delivery's
// OnPacketEncode does the same for the packets mochi writes).

// writeDirect writes b, one whole encoded packet, to cl's connection in one
// Write (so it never interleaves with packets mochi writes, and lands in the
// cork buffer while the connection is corked), and counts it in mochi's
// $SYS totals as WritePacket would.
func writeDirect(srv *mochi.Server, cl *mochi.Client, b []byte, publish bool) error {
	if cl.Closed() {
		return mochi.ErrConnectionClosed
	}
	conn := cl.Net.Conn
	if conn == nil {
		return nil // mochi's inline client: nothing to write to
	}
	n, err := conn.Write(b)
	if err != nil {
		return err
	}
	atomic.AddInt64(&srv.Info.BytesSent, int64(n))
	atomic.AddInt64(&srv.Info.PacketsSent, 1)
	if publish {
		atomic.AddInt64(&srv.Info.MessagesSent, 1)
	}
	return nil
}

// appendAck appends a successful PUBACK or PUBREC (typ) for id: the same
// four bytes for MQTT 3.1.1 and 5 (a v5 ack of reason Success with no
// properties leaves both out, [MQTT-3.4.2.1], as mochi writes it).
func appendAck(dst []byte, typ byte, id uint16) []byte {
	return binary.BigEndian.AppendUint16(append(dst, typ<<4, 2), id)
}

// publishExtras is what an extension subscription ($replay, $group) adds
// to a record's PUBLISH, kept apart from the packet so that neither the
// topic nor the properties are built as strings for each record: the topic
// sent is head, the offset, "/" and the record's topic, and MQTT 5
// deliveries carry the user properties stream, offset and timestamp after
// the record's own, and client after them when it is set.
type publishExtras struct {
	head      string
	stream    string
	offset    uint64
	timestamp int64
	client    string // the publisher's client id, when shown (tap.clients)
}

// appendTopic appends the delivered topic for the record topic t.
func (x *publishExtras) appendTopic(dst []byte, t string) []byte {
	dst = append(dst, x.head...)
	dst = strconv.AppendUint(dst, x.offset, 10)
	dst = append(dst, '/')
	return append(dst, t...)
}

// userLen is the length of x's user properties, encoded.
func (x *publishExtras) userLen() int {
	var num [20]byte
	n := 3*5 + len(propStream) + len(x.stream) +
		len(propOffset) + len(strconv.AppendUint(num[:0], x.offset, 10)) +
		len(propTimestamp) + len(strconv.AppendInt(num[:0], x.timestamp, 10))
	if x.client != "" {
		n += 5 + len(propClient) + len(x.client)
	}
	return n
}

// appendUser appends x's user properties.
func (x *publishExtras) appendUser(dst []byte) []byte {
	var num [20]byte
	dst = appendUserProp(dst, propStream, x.stream)
	dst = appendUserPropBytes(dst, propOffset, strconv.AppendUint(num[:0], x.offset, 10))
	dst = appendUserPropBytes(dst, propTimestamp, strconv.AppendInt(num[:0], x.timestamp, 10))
	if x.client != "" {
		dst = appendUserProp(dst, propClient, x.client)
	}
	return dst
}

// appendPublish appends pk, a PUBLISH, with the extras x (nil for none),
// encoded for protocol version 5 when v5 (else 3.1.1), to dst. withUser
// false leaves the user properties out.
func appendPublish(dst []byte, pk *packets.Packet, x *publishExtras, v5, withUser bool) []byte {
	topicLen := len(pk.TopicName)
	if x != nil {
		var num [20]byte
		topicLen += len(x.head) + len(strconv.AppendUint(num[:0], x.offset, 10)) + 1
	}
	var props int
	if v5 {
		props = publishPropsLen(&pk.Properties, withUser)
		if x != nil && withUser {
			props += x.userLen()
		}
	}
	remaining := 2 + topicLen + len(pk.Payload)
	if pk.FixedHeader.Qos > 0 {
		remaining += 2
	}
	if v5 {
		remaining += varintLen(props) + props
	}

	fh := pk.FixedHeader
	dst = append(dst, packets.Publish<<4|bit(fh.Dup)<<3|fh.Qos<<1|bit(fh.Retain))
	dst = appendVarint(dst, remaining)
	dst = binary.BigEndian.AppendUint16(dst, uint16(topicLen))
	if x != nil {
		dst = x.appendTopic(dst, pk.TopicName)
	} else {
		dst = append(dst, pk.TopicName...)
	}
	if fh.Qos > 0 {
		dst = binary.BigEndian.AppendUint16(dst, pk.PacketID)
	}
	if v5 {
		dst = appendVarint(dst, props)
		dst = appendPublishProps(dst, &pk.Properties, withUser)
		if x != nil && withUser {
			dst = x.appendUser(dst)
		}
	}
	return append(dst, pk.Payload...)
}

// publishPropsLen is the length of the property block appendPublishProps
// writes, without its own length prefix.
func publishPropsLen(p *packets.Properties, withUser bool) int {
	n := 0
	if p.PayloadFormatFlag {
		n += 2
	}
	if p.MessageExpiryInterval > 0 {
		n += 5
	}
	if p.ContentType != "" {
		n += 3 + len(p.ContentType)
	}
	if sendResponseTopic(p.ResponseTopic) {
		n += 3 + len(p.ResponseTopic)
	}
	if len(p.CorrelationData) > 0 {
		n += 3 + len(p.CorrelationData)
	}
	for _, id := range p.SubscriptionIdentifier {
		if id > 0 {
			n += 1 + varintLen(id)
		}
	}
	if p.TopicAliasFlag && p.TopicAlias > 0 {
		n += 3
	}
	if withUser {
		for _, u := range p.User {
			n += 5 + len(u.Key) + len(u.Val)
		}
	}
	return n
}

// appendPublishProps appends the properties a PUBLISH may carry, in the
// order mochi's Properties.Encode writes them.
func appendPublishProps(dst []byte, p *packets.Properties, withUser bool) []byte {
	if p.PayloadFormatFlag {
		dst = append(dst, packets.PropPayloadFormat, p.PayloadFormat)
	}
	if p.MessageExpiryInterval > 0 {
		dst = append(dst, packets.PropMessageExpiryInterval)
		dst = binary.BigEndian.AppendUint32(dst, p.MessageExpiryInterval)
	}
	if p.ContentType != "" {
		dst = appendString(append(dst, packets.PropContentType), p.ContentType)
	}
	if sendResponseTopic(p.ResponseTopic) {
		dst = appendString(append(dst, packets.PropResponseTopic), p.ResponseTopic)
	}
	if len(p.CorrelationData) > 0 {
		dst = append(dst, packets.PropCorrelationData)
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(p.CorrelationData)))
		dst = append(dst, p.CorrelationData...)
	}
	for _, id := range p.SubscriptionIdentifier {
		if id > 0 {
			dst = appendVarint(append(dst, packets.PropSubscriptionIdentifier), id)
		}
	}
	if p.TopicAliasFlag && p.TopicAlias > 0 {
		dst = append(dst, packets.PropTopicAlias)
		dst = binary.BigEndian.AppendUint16(dst, p.TopicAlias)
	}
	if withUser {
		for _, u := range p.User {
			dst = appendUserProp(dst, u.Key, u.Val)
		}
	}
	return dst
}

func appendUserProp(dst []byte, k, v string) []byte {
	return appendString(appendString(append(dst, packets.PropUser), k), v)
}

func appendUserPropBytes(dst []byte, k string, v []byte) []byte {
	dst = appendString(append(dst, packets.PropUser), k)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(v)))
	return append(dst, v...)
}

// sendResponseTopic: a response topic with wildcards is not sent, as in
// mochi ([MQTT-3.3.2-14]: it must be a topic name).
func sendResponseTopic(t string) bool {
	return t != "" && !strings.ContainsAny(t, "+#")
}

// appendString appends an MQTT UTF-8 string: a 16-bit length, then the
// bytes. Callers keep strings below 64 KiB (topics and properties that came
// in through MQTT are).
func appendString(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// appendVarint appends n as an MQTT Variable Byte Integer.
func appendVarint(dst []byte, n int) []byte {
	for {
		b := byte(n & 0x7f)
		n >>= 7
		if n > 0 {
			b |= 0x80
		}
		dst = append(dst, b)
		if n == 0 {
			return dst
		}
	}
}

// varintLen is how many bytes appendVarint writes for n.
func varintLen(n int) int {
	l := 1
	for n >= 0x80 {
		n >>= 7
		l++
	}
	return l
}

func bit(b bool) byte {
	if b {
		return 1
	}
	return 0
}
