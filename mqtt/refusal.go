package mqtt

import (
	"errors"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// refusals maps the append errors mqtt tells apart to the MQTT 5 reason
// code and string a refused publish gets; anything else is 0x80 "not
// stored". A PUBACK may carry only 0x00, 0x10, 0x80, 0x83, 0x87, 0x90,
// 0x91, 0x97 and 0x99 (MQTT 5 3.4.2.1), so "leader unavailable" is 0x80
// with its reason: 0x88 (Server unavailable) is a CONNACK's code, not a
// PUBACK's. The client may publish again; the reason says whether waiting
// helps.
var refusals = []struct {
	err  error
	code packets.Code
}{
	{logstore.ErrNoSpace, packets.Code{Code: packets.ErrQuotaExceeded.Code, Reason: "not stored: disk full"}},
	{logstore.ErrRecordTooLarge, packets.Code{Code: packets.ErrQuotaExceeded.Code, Reason: "not stored: record too large for the log"}},
	{ErrNotEnoughReplicas, packets.Code{Code: packets.ErrQuotaExceeded.Code, Reason: "not stored: not enough in-sync replicas"}},
	{ErrLeaderUnavailable, packets.Code{Code: packets.ErrUnspecifiedError.Code, Reason: "not stored: stream leader unavailable"}},
}

// refusalCode is the MQTT 5 reason for a failed append.
// A *Refusal in err gives the reason string.
func refusalCode(err error) packets.Code {
	code := codeNotSaved
	for _, r := range refusals {
		if errors.Is(err, r.err) {
			code = r.code
			break
		}
	}
	if rf, ok := errors.AsType[*Refusal](err); ok && rf.Reason != "" {
		code.Reason = "not stored: " + rf.Reason
	}
	return code
}
