package logstore

// Record is one stored message of a stream. The appender assigns Offset,
// Epoch and (when zero) Timestamp; everything else is what the producer sent.
// A Record handed to Append or returned by Read must not be modified
// afterwards: readers share them.
type Record struct {
	Offset    uint64 // position in the stream, assigned on append
	Timestamp int64  // unix milliseconds, broker clock
	Topic     string // the original MQTT topic
	Payload   []byte
	QoS       byte
	Retain    bool
	ClientID  string // the producer's MQTT client id
	Epoch     uint32 // leader epoch of the node that wrote it
	// MessageExpiry is the MQTT 5 Message Expiry Interval in seconds,
	// counted from Timestamp; 0 when the message never expires. It sits
	// beside Epoch, in what would be padding: a Record is no larger for it.
	MessageExpiry uint32

	// MQTT 5 properties worth keeping.
	ContentType     string
	PayloadFormat   *byte // nil when the producer did not set it
	ResponseTopic   string
	CorrelationData []byte
	UserProperties  []UserProperty
}

// UserProperty is an MQTT 5 user property: an ordered key/value pair that
// may repeat.
type UserProperty struct {
	Key   string
	Value string
}

// Size is the approximate number of bytes the record costs in memory and on
// disk; retention and batching limits are counted in it.
func (r *Record) Size() int {
	n := 40 + len(r.Topic) + len(r.Payload) + len(r.ClientID) + len(r.ContentType) +
		len(r.ResponseTopic) + len(r.CorrelationData)
	for _, p := range r.UserProperties {
		n += len(p.Key) + len(p.Value) + 4
	}
	return n
}

// ExpiryLeft is what is left of r's lifetime at now (unix ms, broker
// clock), in whole seconds rounded up: at least 1 while r lives, never more
// than MessageExpiry (a clock that went back does not lengthen it).
// expired reports that the lifetime has passed. A record without expiry
// has 0 left and never expires.
func (r *Record) ExpiryLeft(now int64) (left uint32, expired bool) {
	if r.MessageExpiry == 0 {
		return 0, false
	}
	lifetime := int64(r.MessageExpiry) * 1000
	age := max(now-r.Timestamp, 0)
	if age >= lifetime {
		return 0, true
	}
	return uint32((lifetime - age + 999) / 1000), false
}
