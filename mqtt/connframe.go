package mqtt

import (
	"fmt"
	"unicode/utf8"

	"github.com/mochi-mqtt/server/v2/packets"
)

// framer follows the packet boundaries of a client's inbound bytes as they
// pass from the socket to mochi, without buffering them, and finds what
// mochi either allocates for before checking (a CONNECT's announced size)
// or refuses without telling an MQTT 5 client why (a packet above the
// Maximum Packet Size, a PUBLISH topic name with a wildcard or ill-formed
// UTF-8). It reads only fixed headers, a CONNECT's protocol level and
// PUBLISH topic names; bodies are skipped by count.
type framer struct {
	maxConnect int // whole CONNECT packet, bytes
	maxPacket  int // whole packet, bytes (the Maximum Packet Size)

	st       frameState
	typ      byte // type of the packet being read
	qos      byte // its QoS, for a PUBLISH
	remain   int  // its remaining length (while stLength: decoded so far)
	mult     int  // stLength: weight of the next length byte
	lenBytes int  // stLength: length bytes read
	pos      int  // stBody: body bytes read
	seen     int  // complete packets read; the first is the CONNECT

	version  byte // the CONNECT's protocol level (4: 3.1.1, 5: MQTT 5), 0 until read
	nameLen  int  // the CONNECT's protocol name length
	bigConn  bool // the CONNECT is above maxConnect: refused once its level is known or the chunk ends
	topicLen int  // a PUBLISH's topic name length
	rn       int  // bytes of an incomplete UTF-8 sequence in r
	r        [utf8.UTFMax]byte
}

type frameState uint8

const (
	stType   frameState = iota // the next byte starts a packet
	stLength                   // reading the remaining length
	stBody                     // reading or skipping the body
)

// refusal is a packet the guard will not hand to mochi.
type refusal struct {
	err    error        // wraps one of the sentinels (ErrPacketTooLarge...)
	reason string       // label of Metrics.Closed
	code   packets.Code // the MQTT 5 reason code sent before closing
}

// connectDone reports whether the whole CONNECT has been read.
func (f *framer) connectDone() bool { return f.seen > 0 }

// scan follows b, the next bytes from the client. It returns nil, or the
// refusal of a packet and where that packet starts in b: a start of 0 or
// less means at the start of b or in bytes scanned before.
func (f *framer) scan(b []byte) (start int, ref *refusal) {
	start = -1
	for i := 0; i < len(b); {
		switch f.st {
		case stType:
			start = i
			f.typ, f.qos = b[i]>>4, (b[i]>>1)&3
			f.remain, f.mult, f.lenBytes, f.pos = 0, 1, 0, 0
			f.topicLen, f.nameLen, f.rn = 0, 0, 0
			i++
			if f.typ == packets.Publish && f.qos == 3 && f.connectDone() {
				return start, malformed("PUBLISH with QoS 3")
			}
			f.st = stLength
		case stLength:
			c := b[i]
			i++
			f.remain += int(c&127) * f.mult
			f.mult *= 128
			f.lenBytes++
			if c&128 != 0 {
				if f.lenBytes == 4 {
					return start, malformed("remaining length longer than 4 bytes")
				}
				continue
			}
			if ref := f.header(); ref != nil {
				return start, ref
			}
		case stBody:
			var ref *refusal
			i, ref = f.body(b, i)
			if ref != nil {
				return start, ref
			}
		}
	}
	if f.bigConn {
		return start, f.connectTooLarge()
	}
	return 0, nil
}

// header checks a complete fixed header.
func (f *framer) header() *refusal {
	size := 1 + f.lenBytes + f.remain
	switch {
	case !f.connectDone() && f.typ == packets.Connect && size > f.maxConnect:
		f.bigConn = true // refused when its protocol level is read, or at the end of this chunk
	case f.connectDone() && size > f.maxPacket:
		return &refusal{
			err:    fmt.Errorf("%w: %d bytes announced, at most %d", ErrPacketTooLarge, size, f.maxPacket),
			reason: ReasonPacketTooLarge,
			code:   packets.ErrPacketTooLarge,
		}
	}
	f.st = stBody
	f.endIfDone()
	return nil
}

// endIfDone ends the packet when its body is read.
func (f *framer) endIfDone() {
	if f.pos == f.remain {
		f.st = stType
		f.seen++
	}
}

// body reads the body from b[i:] and returns where it stopped.
func (f *framer) body(b []byte, i int) (int, *refusal) {
	for i < len(b) && f.pos < f.remain {
		switch {
		case f.typ == packets.Connect && !f.connectDone() && f.pos < 2:
			f.nameLen = f.nameLen<<8 | int(b[i])
		case f.typ == packets.Connect && !f.connectDone() && f.pos == 2+f.nameLen:
			f.version = b[i]
			if f.bigConn {
				return i + 1, f.connectTooLarge()
			}
		case f.typ == packets.Publish && f.connectDone() && f.pos < 2:
			f.topicLen = f.topicLen<<8 | int(b[i])
			if f.pos == 1 {
				need := 2 + f.topicLen
				if f.qos > 0 {
					need += 2 // packet identifier
				}
				if need > f.remain {
					return i, malformed("topic name runs past the packet")
				}
			}
		case f.typ == packets.Publish && f.connectDone() && f.pos < 2+f.topicLen:
			if ref := f.topicByte(b[i], f.pos == 1+f.topicLen); ref != nil {
				return i, ref
			}
		default:
			// Skip to the next byte worth reading: a CONNECT's protocol
			// level, or the end of the packet (or of b).
			until := f.remain
			if f.typ == packets.Connect && !f.connectDone() && f.pos < 2+f.nameLen {
				until = min(until, 2+f.nameLen)
			}
			n := min(until-f.pos, len(b)-i)
			i += n
			f.pos += n
			continue
		}
		i++
		f.pos++
	}
	f.endIfDone()
	return i, nil
}

// topicByte checks one byte of a PUBLISH topic name: no wildcard, valid
// UTF-8 without U+0000 (mochi's rule, [MQTT-1.5.4-1] [MQTT-1.5.4-2]).
func (f *framer) topicByte(c byte, last bool) *refusal {
	if f.rn == 0 && c < utf8.RuneSelf {
		switch c {
		case '+', '#':
			return &refusal{
				err:    fmt.Errorf("%w: %q", ErrTopicInvalid, c),
				reason: ReasonTopicInvalid,
				code:   packets.Code{Code: packets.ErrTopicNameInvalid.Code, Reason: "topic name contains a wildcard"},
			}
		case 0:
			return malformed("topic name contains U+0000")
		}
		return nil
	}
	f.r[f.rn] = c
	f.rn++
	if utf8.FullRune(f.r[:f.rn]) {
		r, n := utf8.DecodeRune(f.r[:f.rn])
		f.rn = 0
		if r == utf8.RuneError && n == 1 {
			return malformed("topic name is not valid UTF-8")
		}
	} else if last {
		f.rn = 0
		return malformed("topic name is not valid UTF-8")
	}
	return nil
}

func (f *framer) connectTooLarge() *refusal {
	return &refusal{
		err:    fmt.Errorf("%w: %d bytes announced, at most %d", ErrConnectTooLarge, 1+f.lenBytes+f.remain, f.maxConnect),
		reason: ReasonConnectTooLarge,
		code:   packets.ErrPacketTooLarge, // a CONNACK reason in MQTT 5
	}
}

// malformed is the refusal of a Malformed Packet (MQTT 5 reason 0x81).
func malformed(what string) *refusal {
	return &refusal{
		err:    fmt.Errorf("%w: %s", ErrMalformed, what),
		reason: ReasonMalformed,
		code:   packets.Code{Code: packets.ErrMalformedPacket.Code, Reason: what},
	}
}
