package mqttsink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// A PUBLISH is encoded by hand, straight into the connection's write
// buffer: mochi's encoder builds each packet in pooled buffers, looks up
// every property's validity in a map and copies the payload twice, which
// cost a fifth of a drain's CPU. The bytes are the same as mochi's
// (encode_test.go compares them), properties in mochi's order.

// MQTT 5 property identifiers a PUBLISH carries.
const (
	propPayloadFormat   = 0x01
	propMessageExpiry   = 0x02
	propContentType     = 0x03
	propResponseTopic   = 0x08
	propCorrelationData = 0x09
	propUser            = 0x26
)

// maxRemaining is the largest remaining length MQTT can express.
const maxRemaining = 268_435_455

// template is a topic template cut at its placeholders.
type template []tmplPart

type tmplPart struct {
	lit  string
	kind byte // 0 literal, 't' {topic}, 's' {stream}, 'n' {node}
}

// compileTemplate cuts a checked template (CheckTopic) into parts.
func compileTemplate(tmpl string) template {
	var t template
	for rest := tmpl; rest != ""; {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			t = append(t, tmplPart{lit: rest})
			break
		}
		if i > 0 {
			t = append(t, tmplPart{lit: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		t = append(t, tmplPart{kind: rest[i+1]})
		rest = rest[i+j+1:]
	}
	return t
}

func (t template) part(p tmplPart, topic, stream, node string) string {
	switch p.kind {
	case 't':
		return topic
	case 's':
		return stream
	case 'n':
		return node
	}
	return p.lit
}

// len is the length of the topic t makes.
func (t template) len(topic, stream, node string) int {
	n := 0
	for _, p := range t {
		n += len(t.part(p, topic, stream, node))
	}
	return n
}

func (t template) append(b []byte, topic, stream, node string) []byte {
	for _, p := range t {
		b = append(b, t.part(p, topic, stream, node)...)
	}
	return b
}

// appendPublish appends the PUBLISH of r (stream's record) with packet id
// pid to b. props is scratch space for the MQTT 5 properties, kept
// between calls so that they cost no allocation.
func (u *Upstream) appendPublish(b []byte, props *[]byte, stream string, r *logstore.Record, pid uint16) ([]byte, error) {
	topicLen := u.topic.len(r.Topic, stream, u.cfg.Node)
	if topicLen > 65535 {
		return b, errors.New("topic longer than 65535 bytes")
	}
	rem := 2 + topicLen + len(r.Payload)
	if u.cfg.QoS > 0 {
		rem += 2
	}
	var p []byte
	if u.cfg.Version == 5 {
		var err error
		if p, err = u.appendProperties((*props)[:0], stream, r); err != nil {
			return b, err
		}
		*props = p
		rem += varintLen(len(p)) + len(p)
	}
	if rem > maxRemaining {
		return b, fmt.Errorf("PUBLISH of %d bytes: over MQTT's limit", rem)
	}
	h := byte(packets.Publish<<4) | u.cfg.QoS<<1
	if r.Retain {
		h |= 1
	}
	b = append(b, h)
	b = appendVarint(b, rem)
	b = append(b, byte(topicLen>>8), byte(topicLen))
	b = u.topic.append(b, r.Topic, stream, u.cfg.Node)
	if u.cfg.QoS > 0 {
		b = append(b, byte(pid>>8), byte(pid))
	}
	if u.cfg.Version == 5 {
		b = appendVarint(b, len(p))
		b = append(b, p...)
	}
	return append(b, r.Payload...), nil
}

// appendProperties appends r's MQTT 5 properties, and the peat ones
// (Properties, Extra), under mochi's rules: a response topic with a
// wildcard is left out.
func (u *Upstream) appendProperties(p []byte, stream string, r *logstore.Record) ([]byte, error) {
	var err error
	str := func(p []byte, id byte, s string) []byte {
		if len(s) > 65535 {
			err = fmt.Errorf("property %#x longer than 65535 bytes", id)
			return p
		}
		p = append(p, id, byte(len(s)>>8), byte(len(s)))
		return append(p, s...)
	}
	if r.PayloadFormat != nil {
		p = append(p, propPayloadFormat, *r.PayloadFormat)
	}
	if r.MessageExpiry > 0 { // the clock only for records that expire
		if left, _ := r.ExpiryLeft(time.Now().UnixMilli()); left > 0 {
			p = binary.BigEndian.AppendUint32(append(p, propMessageExpiry), left)
		}
	}
	if r.ContentType != "" {
		p = str(p, propContentType, r.ContentType)
	}
	if r.ResponseTopic != "" && !strings.ContainsAny(r.ResponseTopic, "+#") {
		p = str(p, propResponseTopic, r.ResponseTopic)
	}
	if len(r.CorrelationData) > 0 {
		p = str(p, propCorrelationData, string(r.CorrelationData))
	}
	user := func(k, v string) {
		if len(v) > 65535 {
			err = fmt.Errorf("user property %q longer than 65535 bytes", k)
			return
		}
		p = str(p, propUser, k)
		p = append(p, byte(len(v)>>8), byte(len(v)))
		p = append(p, v...)
	}
	for _, up := range r.UserProperties {
		user(up.Key, up.Value)
	}
	if u.cfg.Properties {
		user(PropStream, stream)
		p = appendNumberProp(p, PropOffset, func(b []byte) []byte { return strconv.AppendUint(b, r.Offset, 10) })
		p = appendNumberProp(p, PropTime, func(b []byte) []byte { return strconv.AppendInt(b, r.Timestamp, 10) })
	}
	if u.cfg.Extra != nil {
		for _, up := range u.cfg.Extra(stream, r) {
			user(up.Key, up.Val)
		}
	}
	return p, err
}

// appendNumberProp appends a user property whose value num appends (a
// number), without formatting it into a string first.
func appendNumberProp(p []byte, key string, num func([]byte) []byte) []byte {
	p = append(p, propUser, byte(len(key)>>8), byte(len(key)))
	p = append(p, key...)
	at := len(p)
	p = num(append(p, 0, 0))
	n := len(p) - at - 2
	p[at], p[at+1] = byte(n>>8), byte(n)
	return p
}

// appendVarint appends MQTT's variable byte integer.
func appendVarint(b []byte, n int) []byte {
	for {
		c := byte(n % 128)
		n /= 128
		if n > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

func varintLen(n int) int {
	l := 1
	for n >= 128 {
		n /= 128
		l++
	}
	return l
}
