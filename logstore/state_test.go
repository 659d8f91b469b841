package logstore

import (
	"errors"
	"testing"
)

func TestStore_StateSurvivesReopen(t *testing.T) {
	cfg := testConfig(t)
	st := openStore(t, cfg)
	if err := st.WriteState(map[string][]byte{"g/a": []byte("1"), "g/b": []byte("2"), "s/x": []byte("3")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.WriteState(map[string][]byte{"g/a": []byte("10")}, []string{"g/b"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.WriteState(map[string][]byte{"g/a": nil}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: got %v, want ErrClosed", err)
	}

	st = openStore(t, cfg)
	got := map[string]string{}
	if err := st.LoadState("g/", func(k string, v []byte) error {
		got[k] = string(v)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["g/a"] != "10" {
		t.Fatalf("state under g/ after reopen = %v, want only g/a=10", got)
	}
	// State keys live apart from streams: a stream's records are untouched.
	if n := st.Stream("default").NextOffset(); n != 0 {
		t.Fatalf("default stream has %d records, want 0", n)
	}
}
