package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"testing"
)

type message interface {
	AppendTo([]byte) []byte
	Decode([]byte) error
}

func TestMessages_RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in, out message
	}{
		{&FetchRequest{"telemetry", "n2", 1733300000000, 7, 1 << 40, 1<<40 - 5, 1 << 20, 500}, &FetchRequest{}},
		{&FetchRequest{}, &FetchRequest{}},
		{&FetchResponse{None, 7, 100, 3, 120, 100, [][]byte{{1, 2, 3}, {}, bytes.Repeat([]byte{9}, 70000)}}, &FetchResponse{}},
		{&FetchResponse{Code: FencedLeaderEpoch, LeaderEpoch: 8}, &FetchResponse{}},
		{&EpochRequest{"s", "n3", 9, 4}, &EpochRequest{}},
		{&EpochResponse{None, 4, 77}, &EpochResponse{}},
		{&CommandRequest{"n2", 1733300000000, 12, []byte{6, 0x94, 1}}, &CommandRequest{}},
		{&CommandResponse{Refused, 5, "n1", "stale stream version"}, &CommandResponse{}},
		{&CommandResponse{Code: NotController, Controller: "n3"}, &CommandResponse{}},
		{&ProduceRequest{"s", "n2", 4, 17, [][]byte{{1, 2}, {}, bytes.Repeat([]byte{7}, 300)}, nil}, &ProduceRequest{}},
		{&ProduceRequest{"s", "n2", 4, 18, [][]byte{{1, 2}, {3}}, []uint64{1 << 40, 7, 1<<40 + 1, 7}}, &ProduceRequest{}},
		{&ProduceResponse{None, 17, 1 << 33, "", nil}, &ProduceResponse{}},
		{&ProduceResponse{None, 18, 0, "mirror s: got offset 9, next is 5", []byte{MirrorDuplicate, MirrorAppended, MirrorRefused}}, &ProduceResponse{}},
		{&ProduceResponse{Code: NotEnoughReplicas, Seq: 3, Message: "isr 1 < 2"}, &ProduceResponse{}},
		{&StateWriteRequest{"s", 4, []KV{{"g/a", []byte{0, 0, 1}}, {"c/x", []byte{}}}, []string{"g/b"}, "", 0}, &StateWriteRequest{}},
		{&StateWriteRequest{"_sessions", 4, []KV{{"s/a", []byte{1}}}, []string{"s/b"}, "n2", 1733300000000}, &StateWriteRequest{}},
		{&StateWriteResponse{Timeout, "slow", nil}, &StateWriteResponse{}},
		{&StateWriteResponse{NotHolder, "", []string{"s/a", "s/b"}}, &StateWriteResponse{}},
		{&StateFetchRequest{"s", "n3", 4, 3, 99, 500}, &StateFetchRequest{}},
		{&StateFetchResponse{None, 4, 100, true, []KV{{"g/a", []byte{1}}}, []string{"g/z"}}, &StateFetchResponse{}},
		{&ClaimRequest{"s", 4, "g/x", "client-1", "n2", 1733300000000, true}, &ClaimRequest{}},
		{&ClaimResponse{None, false, "client-2"}, &ClaimResponse{}},
	} {
		b := tc.in.AppendTo([]byte("prefix"))
		if !bytes.HasPrefix(b, []byte("prefix")) {
			t.Fatalf("%T: AppendTo lost dst", tc.in)
		}
		if err := tc.out.Decode(b[6:]); err != nil {
			t.Fatalf("%T: %v", tc.in, err)
		}
		if !reflect.DeepEqual(tc.in, tc.out) {
			t.Fatalf("round trip %+v -> %+v", tc.in, tc.out)
		}
		// Every truncation fails, none panics.
		for i := 0; i < len(b)-6; i++ {
			if err := tc.out.Decode(b[6 : 6+i]); err == nil {
				t.Fatalf("%T: decoding %d of %d bytes succeeded", tc.in, i, len(b)-6)
			}
		}
	}
}

// A mirror append's positions must match its records, one pair each, and
// its answer's results be known ones; the older, shorter frames decode
// as before.
func TestProduce_MirrorFields(t *testing.T) {
	bad := (&ProduceRequest{"s", "n2", 4, 17, [][]byte{{1}, {2}}, []uint64{5, 0}}).AppendTo(nil)
	if err := new(ProduceRequest).Decode(bad); err == nil {
		t.Error("2 records with 1 mirror position decoded")
	}
	if err := new(ProduceResponse).Decode((&ProduceResponse{Results: []byte{3}}).AppendTo(nil)); err == nil {
		t.Error("mirror result 3 decoded")
	}
	var old ProduceRequest
	if err := old.Decode((&ProduceRequest{"s", "n2", 4, 17, [][]byte{{1}}, nil}).AppendTo(nil)); err != nil || old.Mirror != nil {
		t.Errorf("a 5-field request: %+v, %v", old, err)
	}
}

// A state write names its node only in the longer frame, and its answer
// lists moved keys only in the longer one: the older frames decode as
// before (unfenced, nothing moved), and the bytes an older node sends
// are those it always sent.
func TestStateWrite_FenceFields(t *testing.T) {
	old := (&StateWriteRequest{Stream: "s", LeaderEpoch: 4, Dels: []string{"s/a"}}).AppendTo(nil)
	if got, want := hex.EncodeToString(old), "94"+"a173"+"04"+"90"+"91a3732f61"; got != want {
		t.Fatalf("unfenced StateWriteRequest bytes\n got %s\nwant %s", got, want)
	}
	var req StateWriteRequest
	if err := req.Decode(old); err != nil || req.Node != "" || req.BrokerEpoch != 0 {
		t.Errorf("a 4-field request: %+v, %v", req, err)
	}
	if got, want := hex.EncodeToString((&StateWriteResponse{Code: Timeout}).AppendTo(nil)), "92"+"0d"+"a0"; got != want {
		t.Fatalf("StateWriteResponse bytes %s, want %s", got, want)
	}
	for name, b := range map[string]string{
		"5 fields, 4 given": "95a173049090",
		"an empty node":     "96a1730490" + "90" + "a0" + "07",
		"an empty moved []": "93" + "0e" + "a0" + "90",
	} {
		raw, _ := hex.DecodeString(b)
		if new(StateWriteRequest).Decode(raw) == nil || new(StateWriteResponse).Decode(raw) == nil {
			t.Errorf("%s (%s) decoded", name, b)
		}
	}
}

// The bytes of a fetch request are the protocol: a change here breaks
// mixed-version sites.
func TestFetchRequest_FormatIsStable(t *testing.T) {
	m := FetchRequest{"s", "n2", 5, 3, 300, 290, 1024, 500}
	got := hex.EncodeToString(m.AppendTo(nil))
	want := "98" + "a173" + "a26e32" + "05" + "03" + "cd012c" + "cd0122" + "cd0400" + "cd01f4"
	if got != want {
		t.Fatalf("FetchRequest bytes\n got %s\nwant %s", got, want)
	}
}

func TestDecode_Refuses(t *testing.T) {
	req, resp := func() message { return &FetchRequest{} }, func() message { return &FetchResponse{} }
	for _, tc := range []struct {
		name string
		m    func() message
		b    string
	}{
		{"the valid request (control)", nil, "98a173a26e320503cd012c00cd0400cd01f4"},
		{"too few fields", req, "97a173a26e320503cd012c00cd0400"},
		{"a negative integer", req, "98a173a26e32ff03cd012c00cd0400cd01f4"},
		{"a string where an integer goes", req, "98a173a26e32a17803cd012c00cd0400cd01f4"},
		{"leader epoch above 32 bits", req, "98a173a26e3205cf0000000100000000cd012c00cd0400cd01f4"},
		{"trailing bytes", req, "98a173a26e320503cd012c00cd0400cd01f400"},
		{"a string length beyond the bytes", req, "98dbffffffff"},
		{"the valid response (control)", nil, "9700010203040591c40100"},
		{"a bin32 declaring 4 GiB", resp, "9700010203040591c6ffffffff00"},
		{"a record count beyond the bytes", resp, "97000102030405dd7fffffff"},
		{"nil instead of the records", resp, "97000102030405c0"},
		{"a str where a record goes", resp, "9700010203040591a100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := hex.DecodeString(tc.b)
			if err != nil {
				t.Fatal(err)
			}
			if tc.m == nil { // a control: the same bytes, valid, decode
				if (&FetchRequest{}).Decode(b) != nil && (&FetchResponse{}).Decode(b) != nil {
					t.Fatalf("control %s does not decode", tc.b)
				}
				return
			}
			if err := tc.m().Decode(b); err == nil {
				t.Fatalf("%s decoded", tc.b)
			}
		})
	}
}

func TestFrame(t *testing.T) {
	var buf bytes.Buffer
	body := (&EpochResponse{None, 2, 9}).AppendTo(nil)
	if err := WriteFrame(&buf, KindEpochResponse, body); err != nil {
		t.Fatal(err)
	}
	if err := WriteFrame(&buf, KindFetchRequest, nil); err != nil {
		t.Fatal(err)
	}
	kind, got, err := ReadFrame(&buf, nil)
	if err != nil || kind != KindEpochResponse || !bytes.Equal(got, body) {
		t.Fatalf("ReadFrame = %d %x %v", kind, got, err)
	}
	if kind, got, err := ReadFrame(&buf, make([]byte, 0, 16)); err != nil || kind != KindFetchRequest || len(got) != 0 {
		t.Fatalf("second ReadFrame = %d %x %v", kind, got, err)
	}
	if _, _, err := ReadFrame(&buf, nil); err != io.EOF {
		t.Fatalf("ReadFrame at the end = %v, want io.EOF", err)
	}
	if _, _, err := ReadFrame(bytes.NewReader([]byte{0x7f, 0xff, 0xff, 0xff, 1}), nil); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("a 2 GiB frame = %v, want ErrFrameTooLarge", err)
	}
	if _, _, err := ReadFrame(bytes.NewReader([]byte{0, 0, 0, 9, 1, 2}), nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a cut frame = %v, want io.ErrUnexpectedEOF", err)
	}
	if err := WriteFrame(io.Discard, 1, make([]byte, MaxFrame)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("writing a frame past MaxFrame = %v", err)
	}
}

func TestCode(t *testing.T) {
	if None.Err() != nil || NotLeader.Err() == nil || !errors.Is(NotLeader.Err(), NotLeader) {
		t.Fatal("Err")
	}
	if !NotLeader.Retriable() || CorruptRecord.Retriable() || OffsetOutOfRange.Retriable() {
		t.Fatal("Retriable")
	}
	if Code(200).Error() != "wire: code 200" || FencedLeaderEpoch.Error() != "wire: fenced leader epoch" {
		t.Fatal(Code(200).Error(), FencedLeaderEpoch.Error())
	}
}
