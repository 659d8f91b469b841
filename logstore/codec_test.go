package logstore

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func codecSamples() []*Record {
	zero, one := byte(0), byte(1)
	many := make([]UserProperty, 20)
	for i := range many {
		many[i] = UserProperty{Key: strings.Repeat("k", i), Value: strings.Repeat("v", 40*i)}
	}
	return []*Record{
		{Offset: 0, Topic: "a"},
		{Offset: 1, Timestamp: 1700000000000, Topic: "sensors/a", Payload: []byte("21.5"), QoS: 1, ClientID: "dev-1"},
		{Offset: 1 << 40, Timestamp: -5, Topic: strings.Repeat("t", 300), Payload: bytes.Repeat([]byte{0xff}, 70000), QoS: 2, Retain: true, Epoch: 7},
		{Offset: 3, Timestamp: -1 << 40, Topic: strings.Repeat("é", 40000), PayloadFormat: &zero},
		{Offset: 4, Topic: "x", ContentType: "application/json", PayloadFormat: &one, ResponseTopic: "reply/1",
			CorrelationData: []byte{0, 1, 2}, UserProperties: many, Epoch: 1<<32 - 1},
		{Offset: 5, Topic: "x", UserProperties: []UserProperty{{"", ""}}},
	}
}

func TestCodec_RoundTrip(t *testing.T) {
	for _, r := range codecSamples() {
		v := encodeRecord(nil, r)
		got, err := decodeRecord(r.Offset, v)
		if err != nil {
			t.Fatalf("decode offset %d: %v", r.Offset, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip of offset %d:\n got %+v\nwant %+v", r.Offset, got, r)
		}
		if _, err := decodeRecord(r.Offset+1, v); err == nil {
			t.Fatalf("value of offset %d decoded at another offset", r.Offset)
		}
	}
}

func TestCodec_CompactForAPlainPublish(t *testing.T) {
	r := &Record{Timestamp: 1700000000000, Topic: "sensors/a/temp", Payload: make([]byte, 8), QoS: 1, ClientID: "dev-1"}
	v := encodeRecord(nil, r)
	overhead := len(v) - len(r.Topic) - len(r.Payload) - len(r.ClientID)
	if overhead > 20 {
		t.Fatalf("value overhead %d bytes for a plain publish, want at most 20", overhead)
	}
}

// Values are standard msgpack: another implementation reads them.
func TestCodec_IsStandardMsgpack(t *testing.T) {
	r := codecSamples()[4]
	v := encodeRecord(nil, r)
	var fields []any
	if err := msgpack.Unmarshal(v[valueHeader:], &fields); err != nil {
		t.Fatalf("vmihailenco/msgpack cannot decode the body: %v", err)
	}
	if len(fields) != numFields || fields[fTopic] != r.Topic || fields[fContentType] != r.ContentType ||
		!bytes.Equal(fields[fCorrelationData].([]byte), r.CorrelationData) {
		t.Fatalf("decoded by msgpack: %v", fields)
	}
	// And what the library writes (with an extra field at the end) we read.
	body, err := msgpack.Marshal([]any{int64(42), "t", []byte("p"), 5, "c", 3, "ct", nil, "", []byte{}, []string{"k", "v"}, map[string]any{"future": []any{1.5, true}}})
	if err != nil {
		t.Fatal(err)
	}
	val := append([]byte{valueVersion, 0, 0, 0, 0}, body...)
	crc := valueCRC(9, val[:1], body)
	val[1], val[2], val[3], val[4] = byte(crc>>24), byte(crc>>16), byte(crc>>8), byte(crc)
	got, err := decodeRecord(9, val)
	if err != nil {
		t.Fatalf("decode library-written value: %v", err)
	}
	want := &Record{Offset: 9, Timestamp: 42, Topic: "t", Payload: []byte("p"), QoS: 1, Retain: true, ClientID: "c",
		Epoch: 3, ContentType: "ct", UserProperties: []UserProperty{{"k", "v"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// FuzzDecodeRecord feeds arbitrary bodies (with a valid checksum, so the
// msgpack decoder is reached) and arbitrary whole values: decoding must
// never panic, and whatever decodes must encode back to a value that
// decodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range codecSamples() {
		v := encodeRecord(nil, r)
		if len(v) > 4096 {
			continue // large seeds slow the fuzzer's mutator to a crawl
		}
		f.Add(r.Offset, v[valueHeader:], false)
		f.Add(r.Offset, v, true)
	}
	props := make([]UserProperty, 17) // array16 header
	v := encodeRecord(nil, &Record{Offset: 7, Topic: "p", UserProperties: props})
	f.Add(uint64(7), v[valueHeader:], false)
	f.Add(uint64(0), []byte{0x9f}, false)
	f.Add(uint64(0), []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, false)
	f.Add(uint64(0), []byte{0x95, 0x00, 0xa0, 0xc6, 0xff, 0xff, 0xff, 0xff}, false)
	f.Add(uint64(0), []byte{0x9c, 0, 0xa0, 0xc0, 0, 0xa0, 0, 0xa0, 0xc0, 0xa0, 0xc0, 0x93, 0xa0}, false)
	f.Fuzz(func(t *testing.T, off uint64, data []byte, raw bool) {
		v := data
		if !raw {
			v = append([]byte{valueVersion, 0, 0, 0, 0}, data...)
			crc := valueCRC(off, v[:1], data)
			v[1], v[2], v[3], v[4] = byte(crc>>24), byte(crc>>16), byte(crc>>8), byte(crc)
		}
		r, err := decodeRecord(off, v)
		if err != nil {
			return
		}
		again, err := decodeRecord(off, encodeRecord(nil, r))
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encode changed the record:\n%+v\n%+v", r, again)
		}
	})
}
