package wire

import (
	"bytes"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"testing"
)

// allMessages are a zero value of every generated message.
func allMessages() []message {
	return []message{&FetchRequest{}, &FetchResponse{}, &EpochRequest{}, &EpochResponse{},
		&CommandRequest{}, &CommandResponse{}, &ProduceRequest{}, &ProduceResponse{},
		&StateWriteRequest{}, &StateWriteResponse{}, &StateFetchRequest{}, &StateFetchResponse{},
		&ClaimRequest{}, &ClaimResponse{}, &ProducedRecord{},
		&HeartbeatRequest{}, &HeartbeatResponse{}}
}

// The fuzz targets cover every message codec_gen.go has.
func TestAllMessages_AreGenerated(t *testing.T) {
	src, err := os.ReadFile("codec_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, m := range regexp.MustCompile(`func \(m \*(\w+)\) Decode`).FindAllSubmatch(src, -1) {
		want[string(m[1])] = true
	}
	got := map[string]bool{}
	for _, m := range allMessages() {
		got[reflect.TypeOf(m).Elem().Name()] = true
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("allMessages %v, codec_gen.go decodes %v", got, want)
	}
}

func fresh(m message) message { return reflect.New(reflect.TypeOf(m).Elem()).Interface().(message) }

// canon is what Decode makes of m's encoding: the fields from an empty
// wire:"opt" one on are left out; a //wire:message (not typed) struct's
// empty lists and bins read as nil, a record or a KV's value as non-nil.
func canon(m message) message {
	c := fresh(m)
	v, src := reflect.ValueOf(c).Elem(), reflect.ValueOf(m).Elem()
	v.Set(src)
	typed := v.Type().Name() == "ProducedRecord"
	for i, opt := 0, false; i < v.NumField(); i++ {
		f := v.Field(i)
		if v.Type().Field(i).Tag.Get("wire") == "opt" {
			opt = f.Len() == 0
		}
		switch {
		case opt:
			f.SetZero()
		case typed:
		case f.Kind() == reflect.Slice && f.Len() == 0:
			f.SetZero()
		case f.Type() == reflect.TypeFor[[]KV]():
			kvs := append([]KV(nil), f.Interface().([]KV)...)
			for j := range kvs {
				if kvs[j].Val == nil {
					kvs[j].Val = []byte{}
				}
			}
			f.Set(reflect.ValueOf(kvs))
		case f.Type() == reflect.TypeFor[[][]byte]():
			recs := append([][]byte(nil), f.Interface().([][]byte)...)
			for j := range recs {
				if recs[j] == nil {
					recs[j] = []byte{}
				}
			}
			f.Set(reflect.ValueOf(recs))
		}
	}
	return c
}

// FuzzDecode: no input makes a decoder panic, and what decodes encodes to
// bytes that decode to the same message.
func FuzzDecode(f *testing.F) {
	for _, s := range goldenSamples() {
		if b := s.m.AppendTo(nil); len(b) < 4096 {
			f.Add(b)
		}
	}
	f.Add((&ProducedRecord{Topic: "s/a", Payload: []byte("x"), UserProperties: []string{"k", "v"}}).AppendTo(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range allMessages() {
			if m.Decode(b) != nil {
				continue
			}
			enc := m.AppendTo(nil)
			again := fresh(m)
			if err := again.Decode(enc); err != nil || !reflect.DeepEqual(m, again) {
				t.Fatalf("%T: %+v re-decoded as %+v (%v)", m, m, again, err)
			}
			if enc2 := again.AppendTo(nil); !bytes.Equal(enc, enc2) {
				t.Fatalf("%T: encoded %x, then %x", m, enc, enc2)
			}
		}
	})
}

// FuzzRoundTrip: every message filled from the fuzzer's bytes decodes
// from its encoding as it was (canon), unless its check refuses it.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x05hello\x03abc\x02\x01\x07\xff\xff\xff\xff\x00\x01\x02\x03\x04\x05\x06\x07\x08"))
	f.Add(bytes.Repeat([]byte{0x81, 3, 'x', 'y', 'z', 0x40}, 40))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range allMessages() {
			fill(reflect.ValueOf(m).Elem(), &filler{data: data})
			enc := m.AppendTo(nil)
			got := fresh(m)
			err := got.Decode(enc)
			if c, ok := canon(m).(interface{ check() error }); ok && c.check() != nil {
				if err == nil {
					t.Fatalf("%T: %+v failed its check but decoded", m, m)
				}
				continue
			}
			if want := canon(m); err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("%T: %+v decoded as %+v (%v), want %+v", m, m, got, err, want)
			}
		}
	})
}

// filler hands out the fuzzer's bytes, zeros once they run out.
type filler struct {
	data []byte
	off  int
}

func (f *filler) byte() byte {
	if f.off >= len(f.data) {
		return 0
	}
	f.off++
	return f.data[f.off-1]
}

// uint spreads the next byte over the sizes msgpack tells apart: a byte
// whose top bits are set is a 1-8 byte big-endian value.
func (f *filler) uint() uint64 {
	c := f.byte()
	if c < 0x80 {
		return uint64(c)
	}
	var v uint64
	for range 1 + int(c&7) {
		v = v<<8 | uint64(f.byte())
	}
	return v
}

// size is a length: mostly small, sometimes across msgpack's 8- and
// 16-bit boundaries.
func (f *filler) size() int {
	switch c := f.byte(); {
	case c < 0xf0:
		return int(c % 40)
	case c < 0xff:
		return 250 + int(f.byte()%20)
	default:
		return 65530 + int(f.byte()%20)
	}
}

func (f *filler) bytes() []byte {
	n := f.size()
	if n == 0 && f.byte()&1 == 0 {
		return nil
	}
	p := make([]byte, n)
	for i := range p {
		p[i] = f.byte()
	}
	return p
}

func fill(v reflect.Value, f *filler) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(string(f.bytes()))
	case reflect.Bool:
		v.SetBool(f.byte()&1 == 1)
	case reflect.Uint8, reflect.Uint32, reflect.Uint64:
		v.SetUint(f.uint()) // truncated to the field's width
	case reflect.Int64:
		v.SetInt(int64(f.uint()))
	case reflect.Pointer:
		if f.byte()&1 == 1 {
			v.Set(reflect.New(v.Type().Elem()))
			fill(v.Elem(), f)
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes(f.bytes())
			return
		}
		n := f.size() % 20
		if n == 0 && f.byte()&1 == 0 {
			return // nil
		}
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		for i := range n {
			fill(v.Index(i), f)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i), f)
		}
	default:
		panic("fill: " + v.Type().String())
	}
}

// doc.go's table of kinds lists every message with its kind and as many
// fields as the struct has (optional ones in parentheses).
func TestDoc_KindsTable(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]byte{"FetchRequest": KindFetchRequest, "FetchResponse": KindFetchResponse,
		"EpochRequest": KindEpochRequest, "EpochResponse": KindEpochResponse,
		"CommandRequest": KindCommandRequest, "CommandResponse": KindCommandResponse,
		"ProduceRequest": KindProduceRequest, "ProduceResponse": KindProduceResponse,
		"StateWriteRequest": KindStateWriteRequest, "StateWriteResponse": KindStateWriteResponse,
		"StateFetchRequest": KindStateFetchRequest, "StateFetchResponse": KindStateFetchResponse,
		"ClaimRequest": KindClaimRequest, "ClaimResponse": KindClaimResponse,
		"HeartbeatRequest": KindHeartbeatRequest, "HeartbeatResponse": KindHeartbeatResponse}
	rows := regexp.MustCompile(`(?m)^//\t(\d+) (\w+) +\[(.*)\]$`).FindAllSubmatch(src, -1)
	if len(rows) != len(kinds) {
		t.Errorf("doc.go lists %d kinds, want %d", len(rows), len(kinds))
	}
	byName := map[string]message{}
	for _, m := range allMessages() {
		byName[reflect.TypeOf(m).Elem().Name()] = m
	}
	for _, r := range rows {
		name := string(r[2])
		if k, ok := kinds[name]; !ok || string(r[1]) != strconv.Itoa(int(k)) {
			t.Errorf("doc.go: kind %s %s, the code says %d", r[1], name, k)
			continue
		}
		depth, fields := 0, 1
		for _, c := range string(r[3]) {
			switch c {
			case '[':
				depth++
			case ']':
				depth--
			case ',':
				if depth == 0 {
					fields++
				}
			}
		}
		if want := reflect.TypeOf(byName[name]).Elem().NumField(); fields != want {
			t.Errorf("doc.go: %s has %d fields, the struct %d", name, fields, want)
		}
	}
}
