package wire

// ProducedRecord is a record as a forwarded append (ProduceRequest)
// carries it: what the producer sent and the follower's timestamp; the
// leader assigns the offset and its epoch. Its form is the one msgpack's
// reflection gave the struct the cluster package encoded before the
// codec was generated (typed: fixed-width integers, nil for a nil
// slice or pointer); fields are only ever appended.
//
//wire:message typed
type ProducedRecord struct {
	Timestamp       int64 // unix milliseconds, the follower's clock
	Topic           string
	Payload         []byte
	QoS             byte
	Retain          bool
	ClientID        string
	MessageExpiry   uint32
	ContentType     string
	PayloadFormat   *byte
	ResponseTopic   string
	CorrelationData []byte
	UserProperties  []string // key, value, key, value...
}
