package mqtt

import (
	"bytes"
	"fmt"
	"unicode/utf8"

	"github.com/mochi-mqtt/server/v2/packets"
)

// framer follows the packet boundaries of a client's inbound bytes as they
// pass from the socket to mochi and checks each packet's structure before
// its last byte reaches mochi (packetcheck.go), so mochi decodes only
// well-formed packets. It also finds what mochi either allocates for
// before checking (a CONNECT's announced size) or refuses without telling
// an MQTT 5 client why (a packet above the Maximum Packet Size, a PUBLISH
// topic name with a wildcard or ill-formed UTF-8). It copies the bodies
// of packets other than PUBLISH (at most the Maximum Packet Size, or
// maxConnect for the CONNECT) and of a PUBLISH only its variable header;
// payloads are skipped by count.
type framer struct {
	maxConnect int // whole CONNECT packet, bytes
	maxPacket  int // whole packet, bytes (the Maximum Packet Size)

	st       frameState
	typ      byte // type of the packet being read
	flags    byte // its fixed header flags
	remain   int  // its remaining length (while stLength: decoded so far)
	mult     int  // stLength: weight of the next length byte
	lenBytes int  // stLength: length bytes read
	pos      int  // stBody: body bytes read
	seen     int  // complete packets read; the first is the CONNECT

	version byte // the CONNECT's protocol level (4: 3.1.1, 5: MQTT 5), 0 until read
	nameLen int  // a too large CONNECT's protocol name length
	bigConn bool // the CONNECT is above maxConnect: refused once its level is known or the chunk ends

	buf     []byte // the body bytes being checked
	want    int    // body bytes to copy into buf
	checked bool   // this packet's checks are done
	topicOK bool   // a PUBLISH's topic name is checked
	aliases aliasTable
	// disconnectReason is the reason code of the last DISCONNECT read
	// (0x00 when it had none), for the read goroutine's hooks (will.go).
	disconnectReason byte
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
			f.typ, f.flags = b[i]>>4, b[i]&15
			f.remain, f.mult, f.lenBytes, f.pos = 0, 1, 0, 0
			f.nameLen, f.want, f.checked, f.topicOK = 0, 0, false, false
			f.buf = f.buf[:0]
			i++
			if ref := checkType(f.typ, f.connectDone(), f.version); ref != nil {
				return start, ref
			}
			if ref := checkFlags(f.typ, f.flags); ref != nil {
				return start, ref
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
	switch {
	case f.bigConn:
	case f.typ == packets.Publish:
		f.want = min(2, f.remain)
	default:
		f.want = f.remain
	}
	return f.endIfDone()
}

// endIfDone checks the packet and ends it when its body is read.
func (f *framer) endIfDone() *refusal {
	if f.pos != f.remain {
		return nil
	}
	if ref := f.check(); ref != nil {
		return ref
	}
	f.st = stType
	f.seen++
	if cap(f.buf) > 4<<10 {
		f.buf = nil // a large SUBSCRIBE's bytes are not kept for the connection's life
	}
	return nil
}

// body reads the body from b[i:] and returns where it stopped.
func (f *framer) body(b []byte, i int) (int, *refusal) {
	if f.bigConn {
		return f.bigConnectBody(b, i)
	}
	for i < len(b) && f.pos < f.remain {
		n := min(f.remain-f.pos, len(b)-i)
		if more := f.want - len(f.buf); more > 0 {
			n = min(n, more)
			f.buf = append(f.buf, b[i:i+n]...)
		}
		i += n
		f.pos += n
		if ref := f.collected(); ref != nil {
			return i, ref
		}
	}
	return i, f.endIfDone()
}

// collected looks at what buf holds so far: a CONNECT's protocol level,
// or as much of a PUBLISH's variable header as there is.
func (f *framer) collected() *refusal {
	switch {
	case f.typ == packets.Connect && f.version == 0 && len(f.buf) >= 2:
		if at := 2 + (int(f.buf[0])<<8 | int(f.buf[1])); len(f.buf) > at {
			f.version = f.buf[at]
		}
	case f.typ == packets.Publish && !f.checked:
		return f.publishCollected()
	}
	return nil
}

// publishCollected checks a PUBLISH's topic name once it is read, then its
// whole variable header, and asks for more bytes until then.
func (f *framer) publishCollected() *refusal {
	qos, v5 := (f.flags>>1)&3, f.version == 5
	need, done := publishHeaderNeed(f.buf, qos, v5)
	if len(f.buf) >= 2 && !f.topicOK {
		topicEnd := 2 + (int(f.buf[0])<<8 | int(f.buf[1]))
		idEnd := topicEnd
		if qos > 0 {
			idEnd += 2
		}
		if idEnd > f.remain {
			return malformed("topic name runs past the packet")
		}
		if len(f.buf) >= topicEnd {
			f.topicOK = true
			if ref := checkTopicText(f.buf[2:topicEnd], v5); ref != nil {
				return ref
			}
		}
	}
	if need > f.remain {
		return malformed("PUBLISH header runs past the packet")
	}
	if !done || len(f.buf) < need {
		f.want = need
		return nil
	}
	f.checked = true
	return checkPublish(f.buf[:need], qos, v5, &f.aliases)
}

// check runs the checks of a packet whose body is read.
func (f *framer) check() *refusal {
	if f.checked || f.bigConn {
		return nil
	}
	f.checked = true
	switch f.typ {
	case packets.Connect:
		level, ref := checkConnect(f.buf)
		f.version = level
		return ref
	case packets.Publish:
		return malformed("PUBLISH header runs past the packet")
	case packets.Disconnect:
		f.disconnectReason = 0
		if len(f.buf) > 0 {
			f.disconnectReason = f.buf[0]
		}
	}
	return checkBody(f.typ, f.buf, f.version == 5)
}

// bigConnectBody follows a CONNECT above maxConnect, uncopied, to its
// protocol level (so that an MQTT 5 client is told why in a CONNACK).
func (f *framer) bigConnectBody(b []byte, i int) (int, *refusal) {
	for i < len(b) && f.pos < f.remain {
		switch {
		case f.pos < 2:
			f.nameLen = f.nameLen<<8 | int(b[i])
		case f.pos == 2+f.nameLen:
			f.version = b[i]
			return i + 1, f.connectTooLarge()
		}
		i++
		f.pos++
	}
	return i, f.endIfDone()
}

// checkTopicText checks a PUBLISH topic name's bytes: valid UTF-8 without
// U+0000 [MQTT-1.5.4-1] [MQTT-1.5.4-2], no wildcard [MQTT-3.3.2-2].
// An empty one is checked with the properties (a Topic Alias may stand
// for it).
func checkTopicText(topic []byte, v5 bool) *refusal {
	if !utf8.Valid(topic) || bytes.IndexByte(topic, 0) >= 0 {
		return malformed("topic name is not valid UTF-8")
	}
	if len(topic) == 0 {
		if !v5 {
			return protocolError("topic name is empty") // [MQTT-4.7.3-1]
		}
		return nil
	}
	return checkTopicName(topic, "topic name")
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
