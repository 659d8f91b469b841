package wire

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

// goldenSamples are messages whose bytes testdata/golden.txt holds, as the
// hand-written codec of every earlier release wrote them: a node of this
// release must write the same bytes and read them back, or a site that
// mixes versions breaks. The values cross every msgpack size boundary the
// codec uses (fixint/uint8/16/32/64, fixstr/str8/str16, bin8/16/32,
// fixarray/array16) and every optional trailing group, present and absent.
func goldenSamples() []struct {
	name string
	m    message
} {
	s31, s32, s255, s256 := strings.Repeat("a", 31), strings.Repeat("b", 32), strings.Repeat("c", 255), strings.Repeat("d", 256)
	b255, b256, b64k := bytes.Repeat([]byte{1}, 255), bytes.Repeat([]byte{2}, 256), bytes.Repeat([]byte{3}, 70000)
	many := make([][]byte, 17)
	for i := range many {
		many[i] = []byte{byte(i)}
	}
	return []struct {
		name string
		m    message
	}{
		{"fetch-request/zero", &FetchRequest{}},
		{"fetch-request/small", &FetchRequest{"s", "n2", 5, 3, 300, 290, 1024, 500}},
		{"fetch-request/ints-127-128", &FetchRequest{s31, s32, 127, 128, 127, 128, 127, 128}},
		{"fetch-request/ints-255-256", &FetchRequest{s255, s256, 255, 256, 255, 256, 255, 256}},
		{"fetch-request/ints-16-bit", &FetchRequest{"t", "n", math.MaxUint16, math.MaxUint16 + 1, math.MaxUint16, math.MaxUint16 + 1, math.MaxUint16, math.MaxUint16 + 1}},
		{"fetch-request/ints-32-bit", &FetchRequest{"t", "n", math.MaxUint32, math.MaxUint32, math.MaxUint32 + 1, math.MaxUint64, math.MaxUint32, math.MaxUint32}},
		{"fetch-response/zero", &FetchResponse{}},
		{"fetch-response/records", &FetchResponse{None, 7, 100, 3, 120, 100, [][]byte{{1, 2, 3}, {}, b255, b256, b64k}}},
		{"fetch-response/17-records", &FetchResponse{None, 1, 2, 0, 19, 2, many}},
		{"fetch-response/fenced", &FetchResponse{Code: FencedLeaderEpoch, LeaderEpoch: 8}},
		{"epoch-request", &EpochRequest{"s", "n3", 9, 4}},
		{"epoch-request/zero", &EpochRequest{}},
		{"epoch-response", &EpochResponse{None, 4, 77}},
		{"epoch-response/max", &EpochResponse{NotHolder, math.MaxUint32, math.MaxUint64}},
		{"command-request", &CommandRequest{"n2", 1733300000000, 12, []byte{6, 0x94, 1}}},
		{"command-request/zero", &CommandRequest{}},
		{"command-response/refused", &CommandResponse{Refused, 5, "n1", "stale stream version"}},
		{"command-response/not-controller", &CommandResponse{Code: NotController, Controller: "n3"}},
		{"produce-request", &ProduceRequest{"s", "n2", 4, 17, [][]byte{{1, 2}, {}, b256}, nil}},
		{"produce-request/zero", &ProduceRequest{}},
		{"produce-request/mirror", &ProduceRequest{"s", "n2", 4, 18, [][]byte{{1, 2}, {3}}, []uint64{1 << 40, 7, 1<<40 + 1, 7}}},
		{"produce-response", &ProduceResponse{None, 17, 1 << 33, "", nil}},
		{"produce-response/mirror", &ProduceResponse{None, 18, 0, "mirror s: got offset 9, next is 5", []byte{MirrorDuplicate, MirrorAppended, MirrorRefused}}},
		{"produce-response/refused", &ProduceResponse{Code: NotEnoughReplicas, Seq: 3, Message: "isr 1 < 2"}},
		{"state-write-request", &StateWriteRequest{"s", 4, []KV{{"g/a", []byte{0, 0, 1}}, {"c/x", []byte{}}}, []string{"g/b"}, "", 0}},
		{"state-write-request/zero", &StateWriteRequest{}},
		{"state-write-request/fenced", &StateWriteRequest{"_sessions", 4, []KV{{"s/a", []byte{1}}}, []string{"s/b"}, "n2", 1733300000000}},
		{"state-write-request/fenced-epoch-0", &StateWriteRequest{Stream: "_sessions", Node: "n2"}},
		{"state-write-response", &StateWriteResponse{Timeout, "slow", nil}},
		{"state-write-response/zero", &StateWriteResponse{}},
		{"state-write-response/moved", &StateWriteResponse{NotHolder, "", []string{"s/a", "s/b"}}},
		{"state-fetch-request", &StateFetchRequest{"s", "n3", 4, 3, 99, 500}},
		{"state-fetch-request/zero", &StateFetchRequest{}},
		{"state-fetch-response", &StateFetchResponse{None, 4, 100, true, []KV{{"g/a", []byte{1}}, {s32, b256}}, []string{"g/z", s256}}},
		{"state-fetch-response/zero", &StateFetchResponse{}},
		{"claim-request/release", &ClaimRequest{"s", 4, "g/x", "client-1", "n2", 1733300000000, true}},
		{"claim-request/zero", &ClaimRequest{}},
		{"claim-response", &ClaimResponse{None, false, "client-2"}},
		{"claim-response/ok", &ClaimResponse{None, true, ""}},
	}
}

// readGolden reads a file of "name hex" lines.
func readGolden(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, h, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Fatalf("%s: line %q", path, sc.Text())
		}
		if out[name], err = hex.DecodeString(h); err != nil {
			t.Fatalf("%s: %s: %v", path, name, err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMessages_GoldenBytes(t *testing.T) {
	golden := readGolden(t, "testdata/golden.txt")
	samples := goldenSamples()
	if len(golden) != len(samples) {
		t.Errorf("testdata/golden.txt has %d messages, the test %d", len(golden), len(samples))
	}
	for _, s := range samples {
		t.Run(s.name, func(t *testing.T) {
			want, ok := golden[s.name]
			if !ok {
				t.Fatal("not in testdata/golden.txt")
			}
			if got := s.m.AppendTo(nil); !bytes.Equal(got, want) {
				t.Fatalf("bytes changed\n got %x\nwant %x", got, want)
			}
			got := reflect.New(reflect.TypeOf(s.m).Elem()).Interface().(message)
			if err := got.Decode(want); err != nil {
				t.Fatal(err)
			}
			if want := canon(s.m); !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded %+v, want %+v", got, want)
			}
		})
	}
}
