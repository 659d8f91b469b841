package logstore

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// kvKeys scans prefix and returns the keys seen, joined by spaces.
func kvKeys(tb testing.TB, st *Store, prefix string, reverse bool) string {
	tb.Helper()
	var keys []string
	if err := st.KVScan([]byte(prefix), reverse, func(k, _ []byte) error {
		keys = append(keys, strings.ReplaceAll(string(k), "\xff", "~"))
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return strings.Join(keys, " ")
}

func TestStore_KV(t *testing.T) {
	top := t
	cfg := testConfig(t)
	st := openStore(t, cfg)

	t.Run("a missing key is ErrNotFound, which raft recognises", func(t *testing.T) {
		_, err := st.KVGet([]byte("CurrentTerm"))
		if !errors.Is(err, ErrNotFound) || err.Error() != "not found" {
			t.Fatalf("KVGet of a missing key = %v, want ErrNotFound reading exactly \"not found\"", err)
		}
	})
	t.Run("set, overwrite, delete, batch", func(t *testing.T) {
		if err := st.KVSet([]byte("CurrentTerm"), []byte{1}); err != nil {
			t.Fatal(err)
		}
		if err := st.KVSet([]byte("CurrentTerm"), []byte{2}); err != nil {
			t.Fatal(err)
		}
		if v, err := st.KVGet([]byte("CurrentTerm")); err != nil || string(v) != "\x02" {
			t.Fatalf("KVGet = %q, %v; want 2", v, err)
		}
		if err := st.KVDelete([]byte("CurrentTerm")); err != nil {
			t.Fatal(err)
		}
		if _, err := st.KVGet([]byte("CurrentTerm")); !errors.Is(err, ErrNotFound) {
			t.Fatalf("KVGet after KVDelete = %v, want ErrNotFound", err)
		}
		puts := []KV{{[]byte("log/a"), []byte("1")}, {[]byte("log/b"), []byte("2")}, {[]byte("log/\xff\xff"), []byte("3")},
			{[]byte("loh"), []byte("after")}, {[]byte("lo"), []byte("before")}, {[]byte("gone"), []byte("x")}}
		if err := st.KVWrite(puts, nil); err != nil {
			t.Fatal(err)
		}
		if err := st.KVWrite([]KV{{[]byte("log/c"), []byte("4")}}, [][]byte{[]byte("gone")}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("scans by prefix, both ways", func(t *testing.T) {
		if got := kvKeys(t, st, "log/", false); got != "log/a log/b log/c log/~~" {
			t.Fatalf("KVScan(log/) = %q", got)
		}
		if got := kvKeys(t, st, "log/", true); got != "log/~~ log/c log/b log/a" {
			t.Fatalf("KVScan(log/, reverse) = %q", got)
		}
		if got := kvKeys(t, st, "", false); got != "lo log/a log/b log/c log/~~ loh" {
			t.Fatalf("KVScan of everything = %q", got)
		}
	})
	t.Run("apart from consumer state", func(t *testing.T) {
		if err := st.WriteState(map[string][]byte{"log/a": []byte("state")}, nil); err != nil {
			t.Fatal(err)
		}
		if v, _ := st.KVGet([]byte("log/a")); string(v) != "1" {
			t.Fatalf("KVGet(log/a) after WriteState(log/a) = %q, want 1", v)
		}
	})
	t.Run("survives a reopen and a crash", func(t *testing.T) {
		crashed := cfg
		crashed.Dir = copyDir(top, cfg.Dir)
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.KVGet([]byte("log/a")); !errors.Is(err, ErrClosed) {
			t.Fatalf("KVGet after Close = %v, want ErrClosed", err)
		}
		for _, c := range []Config{cfg, crashed} {
			st2 := openStore(top, c)
			if got := kvKeys(t, st2, "", false); got != "lo log/a log/b log/c log/~~ loh" {
				t.Fatalf("after reopen KVScan = %q", got)
			}
		}
	})
}

// Under interval durability (no SyncWrites) a key-value write is synced
// before it returns, not at the next SyncInterval.
func TestStore_KVWriteIsSyncedUnderIntervalDurability(t *testing.T) {
	syncs := recordSyncs(t)
	cfg := testConfig(t, StreamConfig{Name: "s", Filters: []string{"#"}, Durability: DurabilityInterval, SyncInterval: time.Hour})
	st := openStore(t, cfg)
	syncs.take()
	if err := st.KVSet([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	got := syncs.take()
	for _, name := range got {
		if strings.HasSuffix(name, ".mem") {
			return
		}
	}
	t.Fatalf("KVSet synced %v, want the memtable log", got)
}
