package mqtt

import (
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// CONNECT and CONNACK where mochi v2.7.9 departs from the specification.

// emptyWill stands in for an empty will payload while mochi validates the
// CONNECT: mochi refuses a will without payload (0x82), but a zero-length
// Will Payload is valid (MQTT 3.1.1 3.1.3.4, MQTT 5 3.1.3.4). Its identity
// marks it: OnConnect, after the validation, empties the will again.
var emptyWill = []byte{0}

// emptyWillPayload gives a CONNECT whose will has a topic but no payload
// the placeholder. A will without a topic is left to the guard, which
// refuses it.
func emptyWillPayload(pk packets.Packet) packets.Packet {
	if pk.Connect.WillFlag && pk.Connect.WillTopic != "" && len(pk.Connect.WillPayload) == 0 {
		pk.Connect.WillPayload = emptyWill[:1:1]
	}
	return pk
}

// OnConnect takes the placeholder of emptyWillPayload out of the client's
// will: it is published with an empty payload.
func (h *ingest) OnConnect(cl *mochi.Client, _ packets.Packet) error {
	if p := cl.Properties.Will.Payload; len(p) == 1 && &p[0] == &emptyWill[0] {
		cl.Properties.Will.Payload = []byte{}
	}
	return nil
}

// connack corrects mochi's CONNACK to cl: Session Present 0 when the
// session cl took over ended with its connection (sessions_takeover.go),
// and, for MQTT 3.1.1, a return code of that version (connackV3).
func connack(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if cc, ok := cl.Net.Conn.(*corkConn); ok && cc.sessionEnded.Load() {
		pk.SessionPresent = false
	}
	return connackV3(cl, pk)
}

// connackV3 gives an MQTT 3.1.1 client that is refused a return code of
// its version: 1 to 5 are all there are [MQTT-3.2.2-6], and mochi passes
// MQTT 5 reason codes through (0x80 for an empty client id with Clean
// Session 0, 0x9B for a will QoS above the maximum...). Each maps to the
// 3.1.1 code closest in meaning; what has none (a refusal of something
// the client asked for) is 3, server unavailable. The connection is closed
// after it, as after any refusal.
func connackV3(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if cl.Properties.ProtocolVersion >= 5 || pk.ReasonCode <= err3Max {
		return pk
	}
	pk.ReasonCode = v3ReturnCode(pk.ReasonCode, cl)
	return pk
}

// err3Max is the highest MQTT 3.1.1 CONNACK return code.
const err3Max = 0x05

// v3ReturnCode maps an MQTT 5 CONNACK reason code for cl.
func v3ReturnCode(code byte, cl *mochi.Client) byte {
	switch code {
	case packets.ErrUnsupportedProtocolVersion.Code:
		return packets.Err3UnsupportedProtocolVersion.Code
	case packets.ErrClientIdentifierNotValid.Code:
		return packets.Err3ClientIdentifierNotValid.Code
	case packets.ErrBadUsernameOrPassword.Code, packets.ErrBadAuthenticationMethod.Code:
		return err3BadCredentials
	case packets.ErrNotAuthorized.Code, packets.ErrBanned.Code:
		return packets.Err3NotAuthorized.Code
	case packets.ErrUnspecifiedError.Code:
		if !cl.Properties.Clean && cl.Properties.Props.AssignedClientID != "" {
			// mochi's only refusal of an empty client id, with Clean
			// Session 0 [MQTT-3.1.3-8]; ParseConnect assigned it one.
			return packets.Err3ClientIdentifierNotValid.Code
		}
	}
	return packets.Err3ServerUnavailable.Code
}
