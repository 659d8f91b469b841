package cluster

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/peatmq/peat/logstore"
)

// fwdRecord is a logstore.Record as a forwarded append carries it: what
// the producer sent and the follower's timestamp; the leader assigns the
// offset and its epoch. A msgpack array, field order fixed (append only).
type fwdRecord struct {
	//lint:ignore U1000 msgpack reads this field's tag: encode as an array
	_msgpack        struct{} `msgpack:",as_array"`
	Timestamp       int64
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

func encodeFwdRecord(r *logstore.Record) ([]byte, error) {
	if r == nil {
		return nil, logstore.ErrNilRecord
	}
	f := fwdRecord{Timestamp: r.Timestamp, Topic: r.Topic, Payload: r.Payload, QoS: r.QoS, Retain: r.Retain,
		ClientID: r.ClientID, MessageExpiry: r.MessageExpiry, ContentType: r.ContentType, PayloadFormat: r.PayloadFormat,
		ResponseTopic: r.ResponseTopic, CorrelationData: r.CorrelationData}
	for _, p := range r.UserProperties {
		f.UserProperties = append(f.UserProperties, p.Key, p.Value)
	}
	return msgpack.Marshal(&f)
}

func decodeFwdRecord(b []byte) (*logstore.Record, error) {
	var f fwdRecord
	if err := msgpack.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("cluster: forwarded record: %w", err)
	}
	if len(f.UserProperties)%2 != 0 {
		return nil, fmt.Errorf("cluster: forwarded record: %d user property strings", len(f.UserProperties))
	}
	r := &logstore.Record{Timestamp: f.Timestamp, Topic: f.Topic, Payload: f.Payload, QoS: f.QoS, Retain: f.Retain,
		ClientID: f.ClientID, MessageExpiry: f.MessageExpiry, ContentType: f.ContentType, PayloadFormat: f.PayloadFormat,
		ResponseTopic: f.ResponseTopic, CorrelationData: f.CorrelationData}
	for i := 0; i < len(f.UserProperties); i += 2 {
		r.UserProperties = append(r.UserProperties, logstore.UserProperty{Key: f.UserProperties[i], Value: f.UserProperties[i+1]})
	}
	return r, nil
}
