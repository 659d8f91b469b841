package logstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"reflect"
	"runtime"
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
		{Offset: 6, Timestamp: 1700000000000, Topic: "x", QoS: 1, MessageExpiry: 60},
		{Offset: 7, Topic: "x", ContentType: "text/plain", UserProperties: []UserProperty{{"k", "v"}}, MessageExpiry: 1<<32 - 1},
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

// TestCodec_OnDiskFormatIsStable pins the stored bytes (header, CRC and
// msgpack body) of records that reach every msgpack encoding boundary, as
// the first (hand-written) encoder wrote them: data already on disk must keep
// decoding, and a value must not change under replication or re-encoding.
// Values up to 48 bytes are compared in hex, longer ones by length and a
// SHA-256 prefix.
func TestCodec_OnDiskFormatIsStable(t *testing.T) {
	want := map[string]string{
		"minimal":                        "01f9d86bbd9400a161c40000",
		"plain publish":                  "01db61f5e295cf0000018bcfe56800a973656e736f72732f61c40432312e3501a56465762d31",
		"empty payload":                  "011449b1dc9400a161c40000",
		"retain qos2 max epoch":          "01aa607fde9600a161c40006a0ceffffffff",
		"payload format zero":            "01958692149800a161c40000a000a000",
		"only user properties":           "0186e282fc9b00a161c40000a000a0c0a0c40092a0a0",
		"every field":                    "56:63448e1443ba9f138f1d6bfb",
		"user properties array16":        "54:6e2ed6dd614619e1c815df49",
		"user properties array32":        "131096:409417557b3ef112398b69bf",
		"message expiry 1":               "01b1c095009c00a161c40000a000a0c0a0c4009001",
		"message expiry max":             "014fadb4429c00a161c40000a000a0c0a0c40090ceffffffff",
		"timestamp -1":                   "011d816d7794ffa161c40000",
		"timestamp -32":                  "013bc2b9fb94e0a161c40000",
		"timestamp -33":                  "012d684c9d94d3ffffffffffffffdfa161c40000",
		"timestamp -128":                 "01052fc3fa94d3ffffffffffffff80a161c40000",
		"timestamp -129":                 "01b494edc694d3ffffffffffffff7fa161c40000",
		"timestamp -32768":               "019158479794d3ffffffffffff8000a161c40000",
		"timestamp -32769":               "015df254e494d3ffffffffffff7fffa161c40000",
		"timestamp -2147483648":          "014aeec8a794d3ffffffff80000000a161c40000",
		"timestamp -2147483649":          "010ef45ffb94d3ffffffff7fffffffa161c40000",
		"timestamp -1099511627776":       "0105057bb894d3ffffff0000000000a161c40000",
		"timestamp -9223372036854775808": "01b79a7d4f94d38000000000000000a161c40000",
		"timestamp 127":                  "010189daa1947fa161c40000",
		"timestamp 128":                  "012c7e398094cc80a161c40000",
		"timestamp 255":                  "0181cda06a94ccffa161c40000",
		"timestamp 256":                  "01dab729c494cd0100a161c40000",
		"timestamp 65535":                "017e1e167f94cdffffa161c40000",
		"timestamp 65536":                "014525cf6894ce00010000a161c40000",
		"timestamp 4294967295":           "014803251394ceffffffffa161c40000",
		"timestamp 4294967296":           "01c84f719c94cf0000000100000000a161c40000",
		"timestamp 9223372036854775807":  "011c1f2d6694cf7fffffffffffffffa161c40000",
		"topic 31":                       "01b2a039079400bf74747474747474747474747474747474747474747474747474747474747474c40000",
		"client id 31":                   "01151566e79500a161c40000bf74747474747474747474747474747474747474747474747474747474747474",
		"topic 32":                       "01b3e600119400d9207474747474747474747474747474747474747474747474747474747474747474c40000",
		"client id 32":                   "01de658ea79500a161c40000d9207474747474747474747474747474747474747474747474747474747474747474",
		"topic 255":                      "267:3771f5e55e19f5b05d7a2bdd",
		"client id 255":                  "269:8877c39d2f4aa7c7d5eb53a0",
		"topic 256":                      "269:14f40d03b84bdd3a54d7be5d",
		"client id 256":                  "271:3997652e40f462c1bf2b6d5b",
		"topic 65535":                    "65548:b1aa52cae3c2bbd08a5da1a1",
		"client id 65535":                "65550:a34239afc9ad0536fadad9b2",
		"topic 65536":                    "65551:318ece201c5fd424fe41e563",
		"client id 65536":                "65553:896ffa9940e5160c45c677c7",
		"payload 1":                      "01e52270929400a161c4010700",
		"payload 255":                    "267:25f44c82485e5cb77f4c7735",
		"payload 256":                    "269:36103eba86bc7e44eb87710b",
		"payload 65535":                  "65548:872dfc4e11392febf2da41ad",
		"payload 65536":                  "65551:5c31218b27e14720a6378031",
	}
	cases := onDiskCases()
	if len(cases) != len(want) {
		t.Fatalf("%d cases, %d golden values", len(cases), len(want))
	}
	for _, c := range cases {
		v := encodeRecord(nil, c.r)
		got := hex.EncodeToString(v)
		if len(v) > 48 {
			sum := sha256.Sum256(v)
			got = fmt.Sprintf("%d:%x", len(v), sum[:12])
		}
		if got != want[c.name] {
			t.Errorf("%s: stored value\n got %s\nwant %s", c.name, got, want[c.name])
		}
		r, err := decodeRecord(c.r.Offset, v)
		if err != nil {
			t.Errorf("%s: decode: %v", c.name, err)
			continue
		}
		if len(c.r.Payload) == 0 {
			r.Payload = c.r.Payload // an empty payload decodes as nil
		}
		if !reflect.DeepEqual(r, c.r) {
			t.Errorf("%s: round trip\n got %+v\nwant %+v", c.name, r, c.r)
		}
	}
}

type onDiskCase struct {
	name string
	r    *Record
}

func onDiskCases() []onDiskCase {
	zero, one := byte(0), byte(1)
	props := func(n int) []UserProperty {
		p := make([]UserProperty, n)
		for i := range p {
			p[i] = UserProperty{Key: "k", Value: "v"}
		}
		return p
	}
	cs := []onDiskCase{
		{"minimal", &Record{Topic: "a"}},
		{"plain publish", &Record{Offset: 1, Timestamp: 1700000000000, Topic: "sensors/a", Payload: []byte("21.5"), QoS: 1, ClientID: "dev-1"}},
		{"empty payload", &Record{Offset: 2, Topic: "a", Payload: []byte{}}},
		{"retain qos2 max epoch", &Record{Offset: 3, Topic: "a", QoS: 2, Retain: true, Epoch: 1<<32 - 1}},
		{"payload format zero", &Record{Offset: 4, Topic: "a", PayloadFormat: &zero}},
		{"only user properties", &Record{Offset: 5, Topic: "a", UserProperties: []UserProperty{{"", ""}}}},
		{"every field", &Record{Offset: 6, Timestamp: 42, Topic: "x", Payload: []byte{1}, QoS: 1, ClientID: "c", Epoch: 7,
			ContentType: "application/json", PayloadFormat: &one, ResponseTopic: "reply/1", CorrelationData: []byte{0, 1, 2},
			UserProperties: []UserProperty{{"k", "v"}, {"k", "w"}}}},
		{"user properties array16", &Record{Offset: 7, Topic: "a", UserProperties: props(8)}},
		{"user properties array32", &Record{Offset: 8, Topic: "a", UserProperties: props(32768)}},
		{"message expiry 1", &Record{Offset: 9, Topic: "a", MessageExpiry: 1}},
		{"message expiry max", &Record{Offset: 9, Topic: "a", MessageExpiry: 1<<32 - 1}},
	}
	for _, ts := range []int64{-1, -32, -33, -128, -129, -32768, -32769, -1 << 31, -1<<31 - 1, -1 << 40, -1 << 63,
		127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1} {
		cs = append(cs, onDiskCase{fmt.Sprint("timestamp ", ts), &Record{Offset: 10, Timestamp: ts, Topic: "a"}})
	}
	for _, n := range []int{31, 32, 255, 256, 65535, 65536} {
		cs = append(cs, onDiskCase{fmt.Sprint("topic ", n), &Record{Offset: 11, Topic: strings.Repeat("t", n)}})
		cs = append(cs, onDiskCase{fmt.Sprint("client id ", n), &Record{Offset: 11, Topic: "a", ClientID: strings.Repeat("t", n)}})
	}
	for _, n := range []int{1, 255, 256, 65535, 65536} {
		cs = append(cs, onDiskCase{fmt.Sprint("payload ", n), &Record{Offset: 12, Topic: "a", Payload: bytes.Repeat([]byte{7}, n)}})
	}
	return cs
}

// Values are standard msgpack: another implementation reads them.
func TestCodec_IsStandardMsgpack(t *testing.T) {
	r := codecSamples()[4]
	v := encodeRecord(nil, r)
	var fields []any
	if err := msgpack.Unmarshal(v[valueHeader:], &fields); err != nil {
		t.Fatalf("vmihailenco/msgpack cannot decode the body: %v", err)
	}
	if len(fields) != fUserProperties+1 || fields[fTopic] != r.Topic || fields[fContentType] != r.ContentType ||
		!bytes.Equal(fields[fCorrelationData].([]byte), r.CorrelationData) {
		t.Fatalf("decoded by msgpack: %v", fields)
	}
	// And what the library writes (with an extra field at the end) we read.
	body, err := msgpack.Marshal([]any{int64(42), "t", []byte("p"), 5, "c", 3, "ct", nil, "", []byte{}, []string{"k", "v"}, 30, map[string]any{"future": []any{1.5, true}}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeRecord(9, withCRC(9, body))
	if err != nil {
		t.Fatalf("decode library-written value: %v", err)
	}
	want := &Record{Offset: 9, Timestamp: 42, Topic: "t", Payload: []byte("p"), QoS: 1, Retain: true, ClientID: "c",
		Epoch: 3, ContentType: "ct", UserProperties: []UserProperty{{"k", "v"}}, MessageExpiry: 30}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// withCRC makes the stored value of body at offset off: with a valid
// checksum, so decoding reaches the msgpack decoder.
func withCRC(off uint64, body []byte) []byte {
	v := append([]byte{valueVersion, 0, 0, 0, 0}, body...)
	binary.BigEndian.PutUint32(v[1:], valueCRC(off, v[:1], body))
	return v
}

type corruptBody struct {
	name string
	body []byte
	want string // in the error
}

// corruptBodies are msgpack bodies a buggy or foreign writer could store
// under a valid checksum: lengths far beyond the value, deep nesting, wrong
// types.
func corruptBodies() []corruptBody {
	// The first ten fields of a record, all empty: ts, topic "a", payload,
	// flags, client id, epoch, content type, payload format, response topic,
	// correlation data. Field 10 is the user properties, 11 the message
	// expiry, 12 the first unknown.
	ten := []byte{0x00, 0xa1, 'a', 0xc4, 0x00, 0x00, 0xa0, 0x00, 0xa0, 0xc0, 0xa0, 0xc4, 0x00}
	fields := func(n byte, tail ...byte) []byte {
		return append(append([]byte{0x90 | n}, ten...), tail...)
	}
	huge := []byte{0xff, 0xff, 0xff, 0xff}
	deep := fields(13, append([]byte{0x90, 0x00}, bytes.Repeat([]byte{0x91}, 100_000)...)...)
	return []corruptBody{
		{"payload bin32 of 4 GiB", append([]byte{0x94, 0x00, 0xa1, 'a', 0xc6}, huge...), "4294967295 bytes declared"},
		{"topic str32 of 4 GiB", append([]byte{0x94, 0x00, 0xdb}, huge...), "4294967295 bytes declared"},
		{"record array32 of 4G fields", append([]byte{0xdd}, huge...), "4294967295 values declared"},
		{"user properties array32 of 4G strings", fields(11, append([]byte{0xdd}, huge...)...), "4294967295 values declared"},
		{"unknown field bin32 of 4 GiB", fields(13, append([]byte{0x90, 0x00, 0xc6}, huge...)...), "4294967295 bytes declared"},
		{"unknown field ext32 of 4 GiB", fields(13, append(append([]byte{0x90, 0x00, 0xc9}, huge...), 1)...), "4294967295 bytes declared"},
		{"unknown field map32 of 4G entries", fields(13, append([]byte{0x90, 0x00, 0xdf}, huge...)...), "values declared"},
		{"unknown field nested 100000 deep", deep, "nested deeper"},
		{"unknown field with an unused code", fields(13, 0x90, 0x00, 0xc1), "unknown code"},
		{"message expiry beyond uint32", fields(12, 0x90, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0), "out of range"},
		{"negative message expiry", fields(12, 0x90, 0xff), "out of range"},
		{"message expiry as a string", fields(12, 0x90, 0xa1, '6'), "invalid code"},
		{"topic longer than the value", []byte{0x94, 0x00, 0xa5, 'a', 0x00, 0x00}, "5 bytes declared, 3 left"},
		{"truncated record", []byte{0x95, 0x00, 0xa1, 'a', 0xc4, 0x00, 0x00}, "value ends early"},
		{"nil timestamp", []byte{0x94, 0xc0, 0xa1, 'a', 0xc4, 0x00, 0x00}, "want an integer"},
		{"timestamp beyond int64", append([]byte{0x94, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0xa1, 'a', 0xc4, 0x00, 0x00), "overflows int64"},
		{"negative flags", []byte{0x94, 0x00, 0xa1, 'a', 0xc4, 0x00, 0xff}, "out of range"},
		{"string for the payload", []byte{0x94, 0x00, 0xa1, 'a', 0xa1, 'p', 0x00}, "want binary data"},
		{"binary topic", []byte{0x94, 0x00, 0xc4, 0x01, 'a', 0xc4, 0x00, 0x00}, "want a string"},
		{"odd user properties", fields(11, 0x91, 0xa0), "odd number"},
		{"nil record", []byte{0xc0}, "want an array"},
		{"three fields", []byte{0x93, 0x00, 0xa1, 'a', 0xc4, 0x00}, "3 fields"},
		{"trailing bytes", []byte{0x94, 0x00, 0xa1, 'a', 0xc4, 0x00, 0x00, 0x00}, "trailing bytes"},
	}
}

// A corrupt body under a valid checksum is an error naming what is wrong;
// it never panics, overflows the stack, or allocates what a corrupt length
// declares.
func TestCodec_CorruptBodyIsAnError(t *testing.T) {
	for _, c := range corruptBodies() {
		t.Run(c.name, func(t *testing.T) {
			v := withCRC(5, c.body)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			r, err := decodeRecord(5, v)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("decode = %+v, %v; want an error with %q", r, err, c.want)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
				t.Fatalf("decoding a %d-byte value allocated %d bytes", len(v), n)
			}
		})
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
	for _, c := range corruptBodies() {
		if len(c.body) <= 4096 {
			f.Add(uint64(0), c.body, false)
		}
	}
	f.Fuzz(func(t *testing.T, off uint64, data []byte, raw bool) {
		v := data
		if !raw {
			v = withCRC(off, data)
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

// benchRecords are what the appender encodes and Read decodes: a plain QoS 1
// publish (the common case) and one with every MQTT 5 property set.
func benchRecords() map[string]*Record {
	one := byte(1)
	return map[string]*Record{
		"plain": {Offset: 123456, Timestamp: 1700000000000, Topic: "sensors/bench/temp",
			Payload: make([]byte, benchPayload), QoS: 1, ClientID: "bench", Epoch: 3},
		"mqtt5": {Offset: 123456, Timestamp: 1700000000000, Topic: "sensors/bench/temp",
			Payload: make([]byte, benchPayload), QoS: 1, ClientID: "bench", Epoch: 3,
			ContentType: "application/json", PayloadFormat: &one, ResponseTopic: "reply/bench",
			CorrelationData: []byte("corr-1234"), UserProperties: []UserProperty{{"site", "a"}, {"unit", "C"}}},
	}
}

func BenchmarkEncodeRecord(b *testing.B) {
	for name, r := range benchRecords() {
		b.Run(name, func(b *testing.B) {
			var dst []byte
			b.SetBytes(int64(len(encodeRecord(nil, r))))
			b.ReportAllocs()
			for b.Loop() {
				dst = encodeRecord(dst[:0], r)
			}
		})
	}
}

func BenchmarkDecodeRecord(b *testing.B) {
	for name, r := range benchRecords() {
		b.Run(name, func(b *testing.B) {
			v := encodeRecord(nil, r)
			b.SetBytes(int64(len(v)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodeRecord(r.Offset, v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Message expiry is field 11: values written before it existed (11 fields
// at most) decode with no expiry, a record without expiry is stored as
// before (the golden values above), and one with expiry keeps it.
func TestCodec_MessageExpiry(t *testing.T) {
	// "every field" of TestCodec_OnDiskFormatIsStable (its golden hash),
	// as the encoder before message expiry wrote it: 11 fields.
	old, err := hex.DecodeString("01409dd9e39b2aa178c4010101a16307b06170706c69636174696f6e2f6a736f6e" +
		"01a77265706c792f31c40300010294a16ba176a16ba177")
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeRecord(6, old)
	if err != nil {
		t.Fatalf("decode a value written before message expiry: %v", err)
	}
	if r.MessageExpiry != 0 || r.ContentType != "application/json" || len(r.UserProperties) != 2 {
		t.Fatalf("decoded %+v", r)
	}
	if again := encodeRecord(nil, r); !bytes.Equal(again, old) {
		t.Fatalf("re-encoded without expiry:\n got % x\nwant % x", again, old)
	}

	r.MessageExpiry = 60
	v := encodeRecord(nil, r)
	got, err := decodeRecord(6, v)
	if err != nil {
		t.Fatal(err)
	}
	if got.MessageExpiry != 60 {
		t.Fatalf("message expiry %d after a round trip, want 60", got.MessageExpiry)
	}
	if !bytes.HasPrefix(v[valueHeader:], append([]byte{0x9c}, old[valueHeader+1:]...)) || v[len(v)-1] != 60 {
		t.Fatalf("expiry is not a 12th field after the 11 old ones: % x", v)
	}
}

func TestRecord_ExpiryLeft(t *testing.T) {
	const ts = 1_700_000_000_000
	for _, c := range []struct {
		expiry  uint32
		now     int64
		left    uint32
		expired bool
	}{
		{0, ts + 1e12, 0, false},          // no expiry: never
		{60, ts, 60, false},               // just stored
		{60, ts - 5000, 60, false},        // clock went back: not longer than sent
		{60, ts + 1, 60, false},           // 59.999 s left: rounded up
		{60, ts + 999, 60, false},         //
		{60, ts + 1000, 59, false},        // whole seconds
		{60, ts + 59_001, 1, false},       // 0.999 s left: still 1, never 0
		{60, ts + 59_999, 1, false},       //
		{60, ts + 60_000, 0, true},        // lifetime over
		{60, ts + 3_600_000, 0, true},     //
		{1<<32 - 1, ts, 1<<32 - 1, false}, // the largest interval does not overflow
		{1<<32 - 1, ts + (1<<32-1)*1000, 0, true},
	} {
		r := &Record{Timestamp: ts, MessageExpiry: c.expiry}
		left, expired := r.ExpiryLeft(c.now)
		if left != c.left || expired != c.expired {
			t.Errorf("expiry %d, %d ms after the timestamp: left %d, expired %v; want %d, %v",
				c.expiry, c.now-ts, left, expired, c.left, c.expired)
		}
	}
}
