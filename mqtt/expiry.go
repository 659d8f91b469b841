package mqtt

import (
	"strconv"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Message expiry (MQTT 5 Message Expiry Interval, [MQTT-3.3.2-5/6]).
//
// The log keeps a publish's interval with its record (logstore, Record
// value), counted from the record's timestamp. Whether a record is still
// alive is decided by the client's sender, once the record has room in the
// client's window, just before the PUBLISH is written: as late as it can
// be, so a record that waited in a queue or behind a full window is judged
// when it would leave.
//
//   - A live record goes out with what is left of its interval, in whole
//     seconds rounded up (logstore.Record.ExpiryLeft): at least 1, never
//     more than the producer sent. MQTT 3.1.1 has no such property; a
//     record without expiry carries none.
//   - An expired record is not sent to ordinary subscriptions, $share
//     groups, durable sessions or $group consumers, whatever their protocol
//     version. It counts as done for the consumer's progress, so a session's
//     position and a group's committed offset move past it, and it is
//     counted in peat_mqtt_dropped_messages_total{reason="expired"}.
//   - $replay reads history: it shows every record the log still holds,
//     expired or not, as retention, not expiry, bounds the log (the audit
//     or rebuild a replay serves wants all of it). An expired record is
//     sent without the Message Expiry Interval, as there is no interval
//     left to give, and, to MQTT 5 clients, with the user property
//     "expired" set to when it expired (unix ms, like "timestamp"), so a
//     replay consumer can tell history that is no longer valid from a
//     message it may still act on. A record still alive when replayed gets
//     what is left, as anywhere else.
//
// A QoS 1/2 delivery written before its expiry is not withdrawn: if the
// connection ends unacknowledged, the session's next connection reads it
// from the log again and it is judged again then.
//
// mochi's own MaximumMessageExpiryInterval is 0 in Peat (broker.go): mochi
// neither caps intervals nor expires anything by age; the producer's
// interval is the only one.

// propExpired is the user property of an expired record delivered by
// $replay: when it expired, unix ms.
const propExpired = "expired"

// expiryOf decides, now, what it is sent with: left, the Message Expiry
// Interval (0: none), or, for an expired record, expiredAt (unix ms) when
// a $replay shows it anyway and skip when nothing is sent.
func expiryOf(it *deliveryItem) (left uint32, expiredAt int64, skip bool) {
	rec := it.rec
	if rec.MessageExpiry == 0 {
		return 0, 0, false
	}
	left, expired := rec.ExpiryLeft(time.Now().UnixMilli())
	switch {
	case !expired:
		return left, 0, false
	case it.ext != nil && it.ext.kind == extReplay:
		return 0, rec.Timestamp + int64(rec.MessageExpiry)*1000, false
	}
	return 0, 0, true
}

// appendExpiredProp appends the "expired" user property for expiredAt to
// the sender's scratch user properties.
func (c *deliveryClient) appendExpiredProp(expiredAt int64) {
	c.ubuf = append(c.ubuf, packets.UserProperty{Key: propExpired, Val: strconv.FormatInt(expiredAt, 10)})
}
