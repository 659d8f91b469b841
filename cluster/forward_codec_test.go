package cluster

import (
	"errors"
	"reflect"
	"testing"

	"github.com/peatmq/peat/logstore"
)

func TestFwdRecord_RoundTrip(t *testing.T) {
	pf := byte(1)
	for _, r := range []*logstore.Record{
		{Topic: "s/a", Payload: []byte("x")},
		{Timestamp: 1733300000000, Topic: "s/b", Payload: []byte{0, 1, 2}, QoS: 1, Retain: true, ClientID: "c1",
			MessageExpiry: 60, ContentType: "text/plain", PayloadFormat: &pf, ResponseTopic: "r/1",
			CorrelationData: []byte{9}, UserProperties: []logstore.UserProperty{{Key: "k", Value: "v"}, {Key: "k", Value: "w"}}},
	} {
		b, err := encodeFwdRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeFwdRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normalRecord(got), normalRecord(r)) {
			t.Fatalf("round trip %+v -> %+v", r, got)
		}
		for i := range b { // every truncation fails, none panics
			if _, err := decodeFwdRecord(b[:i]); err == nil {
				t.Fatalf("decoding %d of %d bytes succeeded", i, len(b))
			}
		}
	}
	if _, err := encodeFwdRecord(nil); !errors.Is(err, logstore.ErrNilRecord) {
		t.Fatalf("encoding nil: %v, want ErrNilRecord", err)
	}
}

// normalRecord maps empty slices to nil: the encoding does not tell them apart.
func normalRecord(r *logstore.Record) *logstore.Record {
	c := *r
	if len(c.Payload) == 0 {
		c.Payload = nil
	}
	if len(c.CorrelationData) == 0 {
		c.CorrelationData = nil
	}
	if len(c.UserProperties) == 0 {
		c.UserProperties = nil
	}
	return &c
}

func FuzzFwdRecord(f *testing.F) {
	b, _ := encodeFwdRecord(&logstore.Record{Topic: "s/a", Payload: []byte("x"), UserProperties: []logstore.UserProperty{{Key: "k", Value: "v"}}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeFwdRecord(b)
		if err != nil {
			return
		}
		again, err := encodeFwdRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := decodeFwdRecord(again)
		if err != nil || !reflect.DeepEqual(normalRecord(r), normalRecord(r2)) {
			t.Fatalf("%+v re-decoded as %+v (%v)", r, r2, err)
		}
	})
}
