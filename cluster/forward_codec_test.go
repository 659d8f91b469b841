package cluster

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

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

// hugeLen reports a 32-bit bin or str length beyond the end of b: the
// earlier codec allocated what such a header declares before it found the
// bytes missing (4 GiB for 16 bytes, TestFwdRecord_HugeLength), which kills
// the fuzzer; both codecs refuse the input.
func hugeLen(b []byte) bool {
	for i := 0; i+5 <= len(b); i++ {
		if (b[i] == 0xc6 || b[i] == 0xdb) && int(binary.BigEndian.Uint32(b[i+1:])) > len(b) {
			return true
		}
	}
	return false
}

// A forwarded record that declares a 4 GiB payload in 16 bytes is refused
// before anything is allocated for it: a peer cannot make the leader run
// out of memory (msgpack's reflection, the earlier codec, allocated it).
func TestFwdRecord_HugeLength(t *testing.T) {
	b, _ := hex.DecodeString("9cd30000000000000000a0c6ffffffff")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := decodeFwdRecord(b); err == nil {
		t.Fatal("a 4 GiB payload in 16 bytes decoded")
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<20 {
		t.Fatalf("decoding 16 bytes allocated %d bytes", n)
	}
}

// fwdRecordV1 is the struct the forwarded record was before its codec
// was generated, which msgpack's reflection encoded: the earlier release's
// codec, kept as the oracle a node of another version is.
type fwdRecordV1 struct {
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
	UserProperties  []string
}

// FuzzFwdRecord: no input makes the decoder panic; what decodes encodes
// to bytes that decode to the same record; and a node of the earlier
// release and this one understand each other: whatever the earlier codec
// wrote, this one reads as it did and writes back byte for byte.
func FuzzFwdRecord(f *testing.F) {
	for _, s := range fwdSamples() {
		b, _ := encodeFwdRecord(s.r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeFwdRecord(b); err == nil {
			again, err := encodeFwdRecord(r)
			if err != nil {
				t.Fatal(err)
			}
			r2, err := decodeFwdRecord(again)
			if err != nil || !reflect.DeepEqual(r, r2) {
				t.Fatalf("%+v re-decoded as %+v (%v)", r, r2, err)
			}
		}
		var old fwdRecordV1
		if hugeLen(b) || msgpack.Unmarshal(b, &old) != nil || len(old.UserProperties)%2 != 0 {
			return // the earlier release refused it too
		}
		if len(old.UserProperties) == 0 {
			old.UserProperties = nil // as the earlier encodeFwdRecord left them
		}
		want, err := msgpack.Marshal(&old)
		if err != nil {
			t.Fatal(err)
		}
		r, err := decodeFwdRecord(want)
		if err != nil {
			t.Fatalf("the earlier codec's %x: %v", want, err)
		}
		if r.Topic != old.Topic || r.Timestamp != old.Timestamp || !bytes.Equal(r.Payload, old.Payload) || len(r.UserProperties) != len(old.UserProperties)/2 {
			t.Fatalf("the earlier codec's %+v read as %+v", old, r)
		}
		if got, _ := encodeFwdRecord(r); !bytes.Equal(got, want) {
			t.Fatalf("the earlier codec wrote %x, this one %x", want, got)
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
