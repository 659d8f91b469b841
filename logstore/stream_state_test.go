package logstore

import (
	"errors"
	"testing"
)

// streamState reads every entry of s's state.
func streamState(tb testing.TB, s *Stream) map[string]string {
	tb.Helper()
	got := map[string]string{}
	if err := s.LoadState("", func(k string, v []byte) error { got[k] = string(v); return nil }); err != nil {
		tb.Fatalf("LoadState: %v", err)
	}
	return got
}

// A stream's state is its own: another stream and the node-wide state do
// not see it, it survives a reopen, and it goes with the stream.
func TestStream_State(t *testing.T) {
	cfg := testConfig(t,
		StreamConfig{Name: "default", Filters: []string{"#"}},
		StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}})
	st, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	def, sen := st.Stream("default"), st.Stream("sensors")
	if err := def.WriteState(map[string][]byte{"g/a": []byte("1"), "g/b": []byte("2"), "s/c": []byte("3")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := sen.WriteState(map[string][]byte{"g/a": []byte("9")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := def.WriteState(map[string][]byte{"g/b": []byte("4")}, []string{"s/c"}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := def.LoadState("g/", func(k string, _ []byte) error { keys = append(keys, k); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] != "g/a" || keys[1] != "g/b" {
		t.Errorf("LoadState(g/) keys = %q, want [g/a g/b] in order", keys)
	}
	if n := 0; st.LoadState("", func(string, []byte) error { n++; return nil }) != nil || n != 0 {
		t.Errorf("node-wide state sees %d stream state entries", n)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = openStore(t, cfg)
	def, sen = st.Stream("default"), st.Stream("sensors")
	if got := streamState(t, def); len(got) != 2 || got["g/a"] != "1" || got["g/b"] != "4" {
		t.Errorf("default's state after reopen = %v, want g/a=1 g/b=4", got)
	}
	if got := streamState(t, sen); len(got) != 1 || got["g/a"] != "9" {
		t.Errorf("sensors' state after reopen = %v, want g/a=9", got)
	}

	id := sen.id
	if err := st.RemoveStream("sensors"); err != nil {
		t.Fatal(err)
	}
	if n := keysWithPrefix(t, st, prefix(tagStreamState, id)); n != 0 {
		t.Errorf("%d state keys left after RemoveStream", n)
	}
	if err := sen.WriteState(map[string][]byte{"g/a": nil}, nil); !errors.Is(err, ErrStreamRemoved) {
		t.Errorf("WriteState on a removed stream = %v, want ErrStreamRemoved", err)
	}
	if err := sen.LoadState("", func(string, []byte) error { return nil }); !errors.Is(err, ErrStreamRemoved) {
		t.Errorf("LoadState on a removed stream = %v, want ErrStreamRemoved", err)
	}
	again, err := st.AddStream(StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := streamState(t, again); len(got) != 0 {
		t.Errorf("a re-added stream inherits state %v", got)
	}
	big := map[string][]byte{}
	for i := range MaxStateWrite + 1 {
		big[string(rune('a'+i%26))+string(rune(i))] = []byte{1}
	}
	if err := def.WriteState(big, nil); err == nil {
		t.Errorf("WriteState of %d entries succeeded, want refused", len(big))
	}
}

func TestStream_Claim(t *testing.T) {
	st := openStore(t, testConfig(t))
	s := st.Stream("default")
	if ok, h := s.Claim("g/a", "c1"); !ok || h != "c1" {
		t.Fatalf("first Claim = %v %q", ok, h)
	}
	if ok, h := s.Claim("g/a", "c2"); ok || h != "c1" {
		t.Errorf("Claim of a held key = %v %q, want refused naming c1", ok, h)
	}
	if ok, _ := s.Claim("g/a", "c1"); !ok {
		t.Error("the holder's second Claim refused")
	}
	if ok, _ := s.Claim("g/b", "c2"); !ok {
		t.Error("Claim of another key refused")
	}
	s.Unclaim("g/a", "c2") // not the holder: nothing happens
	if ok, h := s.Claim("g/a", "c2"); ok || h != "c1" {
		t.Errorf("after a stranger's Unclaim, Claim = %v %q, want refused", ok, h)
	}
	s.Unclaim("g/a", "c1")
	if ok, _ := s.Claim("g/a", "c2"); !ok {
		t.Error("Claim after the holder's Unclaim refused")
	}
}
