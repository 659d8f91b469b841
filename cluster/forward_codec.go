package cluster

import (
	"fmt"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
)

// encodeFwdRecord writes a logstore.Record as a forwarded append carries
// it (wire.ProducedRecord): what the producer sent and the follower's
// timestamp; the leader assigns the offset and its epoch.
func encodeFwdRecord(r *logstore.Record) ([]byte, error) {
	if r == nil {
		return nil, logstore.ErrNilRecord
	}
	f := wire.ProducedRecord{Timestamp: r.Timestamp, Topic: r.Topic, Payload: r.Payload, QoS: r.QoS, Retain: r.Retain,
		ClientID: r.ClientID, MessageExpiry: r.MessageExpiry, ContentType: r.ContentType, PayloadFormat: r.PayloadFormat,
		ResponseTopic: r.ResponseTopic, CorrelationData: r.CorrelationData}
	if len(r.UserProperties) > 0 {
		f.UserProperties = make([]string, 0, 2*len(r.UserProperties))
		for _, p := range r.UserProperties {
			f.UserProperties = append(f.UserProperties, p.Key, p.Value)
		}
	}
	return f.AppendTo(nil), nil
}

func decodeFwdRecord(b []byte) (*logstore.Record, error) {
	var f wire.ProducedRecord
	if err := f.Decode(b); err != nil {
		return nil, fmt.Errorf("cluster: forwarded record: %w", err)
	}
	if len(f.UserProperties)%2 != 0 {
		return nil, fmt.Errorf("cluster: forwarded record: %d user property strings", len(f.UserProperties))
	}
	r := &logstore.Record{Timestamp: f.Timestamp, Topic: f.Topic, Payload: f.Payload, QoS: f.QoS, Retain: f.Retain,
		ClientID: f.ClientID, MessageExpiry: f.MessageExpiry, ContentType: f.ContentType, PayloadFormat: f.PayloadFormat,
		ResponseTopic: f.ResponseTopic, CorrelationData: f.CorrelationData}
	if n := len(f.UserProperties); n > 0 {
		r.UserProperties = make([]logstore.UserProperty, 0, n/2)
		for i := 0; i < n; i += 2 {
			r.UserProperties = append(r.UserProperties, logstore.UserProperty{Key: f.UserProperties[i], Value: f.UserProperties[i+1]})
		}
	}
	return r, nil
}
