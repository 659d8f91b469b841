package logstore

import (
	"errors"
	"strings"
	"testing"
)

func TestStore_KVScanRange(t *testing.T) {
	st := openStore(t, testConfig(t))
	var puts []KV
	for _, k := range []string{"a", "l1", "l2", "l3", "l4", "m", "\xff"} {
		puts = append(puts, KV{[]byte(k), []byte("v" + k)})
	}
	if err := st.KVWrite(puts, [][]byte{[]byte("l3")}); err != nil {
		t.Fatal(err)
	}
	// A record and a stream's meta keys sit outside the key-value space.
	appendN(t, st.Stream("default"), 3, 1)

	scan := func(start, end string, nilEnd, reverse bool) string {
		t.Helper()
		var e []byte
		if !nilEnd {
			e = []byte(end)
		}
		var keys []string
		err := st.KVScanRange([]byte(start), e, reverse, func(k, v []byte) error {
			if string(v) != "v"+string(k) {
				t.Errorf("value of %q = %q", k, v)
			}
			keys = append(keys, strings.ReplaceAll(string(k), "\xff", "~"))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(keys, " ")
	}
	for _, tc := range []struct {
		name, start, end string
		nilEnd, reverse  bool
		want             string
	}{
		{"a range, deleted keys skipped", "l1", "l4", false, false, "l1 l2"},
		{"a range backwards", "l1", "l4", false, true, "l2 l1"},
		{"end is exclusive, start inclusive", "l2", "m", false, false, "l2 l4"},
		{"start between keys", "l", "l2", false, false, "l1"},
		{"no upper bound", "l4", "", true, false, "l4 m ~"},
		{"no upper bound backwards", "l4", "", true, true, "~ m l4"},
		{"everything", "", "", true, false, "a l1 l2 l4 m ~"},
		{"empty range", "m", "l", false, false, ""},
		{"nothing in range", "b", "c", false, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := scan(tc.start, tc.end, tc.nilEnd, tc.reverse); got != tc.want {
				t.Fatalf("KVScanRange(%q, %q, reverse=%v) = %q, want %q", tc.start, tc.end, tc.reverse, got, tc.want)
			}
		})
	}
	t.Run("fn's error stops the scan and is returned", func(t *testing.T) {
		stop := errors.New("stop")
		n := 0
		err := st.KVScanRange(nil, nil, false, func(_, _ []byte) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Fatalf("KVScanRange = %v after %d calls, want stop after 1", err, n)
		}
	})
}
