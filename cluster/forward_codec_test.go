package cluster

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
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

// fwdSamples are records whose forwarded bytes testdata/forwarded_record.txt
// holds, as every earlier release wrote them (msgpack's reflection of a
// 12-field array): a leader of another version must read them unchanged.
func fwdSamples() []struct {
	name string
	r    *logstore.Record
} {
	pf0, pf1 := byte(0), byte(1)
	props := make([]logstore.UserProperty, 9)
	for i := range props {
		props[i] = logstore.UserProperty{Key: "k", Value: strings.Repeat("v", i)}
	}
	return []struct {
		name string
		r    *logstore.Record
	}{
		{"zero", &logstore.Record{}},
		{"small", &logstore.Record{Topic: "s/a", Payload: []byte("x")}},
		{"empty-slices", &logstore.Record{Topic: "s/a", Payload: []byte{}, CorrelationData: []byte{}, UserProperties: []logstore.UserProperty{}}},
		{"all-fields", &logstore.Record{Timestamp: 1733300000000, Topic: "s/b", Payload: []byte{0, 1, 2}, QoS: 1, Retain: true, ClientID: "c1",
			MessageExpiry: 60, ContentType: "text/plain", PayloadFormat: &pf1, ResponseTopic: "r/1",
			CorrelationData: []byte{9}, UserProperties: []logstore.UserProperty{{Key: "k", Value: "v"}, {Key: "k", Value: "w"}}}},
		{"format-0", &logstore.Record{Topic: "t", PayloadFormat: &pf0, QoS: 2}},
		{"negative-time", &logstore.Record{Timestamp: -1, Topic: "t"}},
		{"extremes", &logstore.Record{Timestamp: math.MinInt64, MessageExpiry: math.MaxUint32, QoS: 255, Topic: strings.Repeat("t", 32)}},
		{"max-time", &logstore.Record{Timestamp: math.MaxInt64, Topic: strings.Repeat("t", 256)}},
		{"large", &logstore.Record{Topic: "big", Payload: bytes.Repeat([]byte{7}, 300), CorrelationData: bytes.Repeat([]byte{8}, 70000)}},
		{"18-property-strings", &logstore.Record{Topic: "p", UserProperties: props}},
	}
}

func TestFwdRecord_GoldenBytes(t *testing.T) {
	golden := readFwdGolden(t)
	if len(golden) != len(fwdSamples()) {
		t.Errorf("testdata/forwarded_record.txt has %d records, the test %d", len(golden), len(fwdSamples()))
	}
	for _, s := range fwdSamples() {
		t.Run(s.name, func(t *testing.T) {
			want, ok := golden[s.name]
			if !ok {
				t.Fatal("not in testdata/forwarded_record.txt")
			}
			got, err := encodeFwdRecord(s.r)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("bytes changed\n got %x\nwant %x", got, want)
			}
			r, err := decodeFwdRecord(want)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normalRecord(r), normalRecord(s.r)) {
				t.Fatalf("decoded %+v, want %+v", r, s.r)
			}
		})
	}
}

func readFwdGolden(t *testing.T) map[string][]byte {
	t.Helper()
	f, err := os.Open("testdata/forwarded_record.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, h, _ := strings.Cut(sc.Text(), " ")
		if out[name], err = hex.DecodeString(h); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return out
}

// A forwarded append encodes each record on the follower and decodes it
// on the leader.
func BenchmarkFwdRecord(b *testing.B) {
	pf := byte(1)
	r := &logstore.Record{Timestamp: 1733300000000, Topic: "site/line-3/temp", Payload: bytes.Repeat([]byte{1}, 200), QoS: 1,
		ClientID: "sensor-17", PayloadFormat: &pf, UserProperties: []logstore.UserProperty{{Key: "unit", Value: "C"}}}
	enc, _ := encodeFwdRecord(r)
	b.Run("Encode", func(b *testing.B) {
		b.SetBytes(int64(len(enc)))
		b.ReportAllocs()
		for range b.N {
			if _, err := encodeFwdRecord(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Decode", func(b *testing.B) {
		b.SetBytes(int64(len(enc)))
		b.ReportAllocs()
		for range b.N {
			if _, err := decodeFwdRecord(enc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
