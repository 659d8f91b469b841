package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/peatmq/peat/logstore"
)

func newRaftStore(tb testing.TB, kv KV) *RaftStore {
	tb.Helper()
	s, err := NewRaftStore(kv)
	if err != nil {
		tb.Fatalf("NewRaftStore: %v", err)
	}
	return s
}

func entry(idx uint64) *raft.Log {
	return &raft.Log{
		Index: idx, Term: idx/10 + 1, Type: raft.LogCommand,
		Data:       []byte(fmt.Sprintf("cmd-%d", idx)),
		Extensions: []byte{byte(idx)},
		AppendedAt: time.Unix(1700000000, int64(idx)),
	}
}

func entries(lo, hi uint64) []*raft.Log {
	var ls []*raft.Log
	for i := lo; i <= hi; i++ {
		ls = append(ls, entry(i))
	}
	return ls
}

func bounds(tb testing.TB, s *RaftStore) (uint64, uint64) {
	tb.Helper()
	f, err := s.FirstIndex()
	if err != nil {
		tb.Fatal(err)
	}
	l, err := s.LastIndex()
	if err != nil {
		tb.Fatal(err)
	}
	return f, l
}

func checkLog(tb testing.TB, s *RaftStore, want *raft.Log) {
	tb.Helper()
	var got raft.Log
	if err := s.GetLog(want.Index, &got); err != nil {
		tb.Fatalf("GetLog(%d): %v", want.Index, err)
	}
	if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type ||
		!bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Extensions, want.Extensions) ||
		!got.AppendedAt.Equal(want.AppendedAt) {
		tb.Fatalf("GetLog(%d) = %+v, want %+v", want.Index, got, *want)
	}
}

func TestRaftStore_Log(t *testing.T) {
	top, dir := t, t.TempDir()
	st := openStore(t, dir)
	s := newRaftStore(t, st)

	t.Run("empty: bounds 0, GetLog is ErrLogNotFound", func(t *testing.T) {
		if f, l := bounds(t, s); f != 0 || l != 0 {
			t.Fatalf("bounds = %d, %d; want 0, 0", f, l)
		}
		var l raft.Log
		if err := s.GetLog(1, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("GetLog on empty = %v, want ErrLogNotFound", err)
		}
	})
	t.Run("StoreLog and StoreLogs, read back with every field", func(t *testing.T) {
		if err := s.StoreLog(entry(1)); err != nil {
			t.Fatal(err)
		}
		if err := s.StoreLogs(entries(2, 300)); err != nil {
			t.Fatal(err)
		}
		if f, l := bounds(t, s); f != 1 || l != 300 {
			t.Fatalf("bounds = %d, %d; want 1, 300", f, l)
		}
		for _, i := range []uint64{1, 2, 255, 256, 257, 300} { // 256: big-endian order past one byte
			checkLog(t, s, entry(i))
		}
		var l raft.Log
		if err := s.GetLog(301, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("GetLog past the end = %v, want ErrLogNotFound", err)
		}
	})
	t.Run("an entry with no data, no extensions and a zero time", func(t *testing.T) {
		bare := &raft.Log{Index: 301, Term: 31, Type: raft.LogNoop}
		if err := s.StoreLog(bare); err != nil {
			t.Fatal(err)
		}
		checkLog(t, s, bare)
	})
	t.Run("DeleteRange of a prefix (compaction)", func(t *testing.T) {
		if err := s.DeleteRange(1, 100); err != nil {
			t.Fatal(err)
		}
		if f, l := bounds(t, s); f != 101 || l != 301 {
			t.Fatalf("bounds = %d, %d; want 101, 301", f, l)
		}
		var l raft.Log
		if err := s.GetLog(100, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("GetLog of a deleted entry = %v, want ErrLogNotFound", err)
		}
		checkLog(t, s, entry(101))
	})
	t.Run("DeleteRange of a suffix (a conflicting tail), then overwrite", func(t *testing.T) {
		if err := s.DeleteRange(251, 400); err != nil {
			t.Fatal(err)
		}
		if f, l := bounds(t, s); f != 101 || l != 250 {
			t.Fatalf("bounds = %d, %d; want 101, 250", f, l)
		}
		repl := entry(251)
		repl.Term, repl.Data = 99, []byte("new leader's")
		if err := s.StoreLogs([]*raft.Log{repl}); err != nil {
			t.Fatal(err)
		}
		checkLog(t, s, repl)
	})
	t.Run("DeleteRange outside the log changes nothing", func(t *testing.T) {
		if err := s.DeleteRange(1, 50); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteRange(1000, 2000); err != nil {
			t.Fatal(err)
		}
		if f, l := bounds(t, s); f != 101 || l != 251 {
			t.Fatalf("bounds = %d, %d; want 101, 251", f, l)
		}
	})
	t.Run("survives reopen", func(t *testing.T) {
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st = openStore(top, dir) // open past this subtest
		s = newRaftStore(t, st)
		if f, l := bounds(t, s); f != 101 || l != 251 {
			t.Fatalf("bounds after reopen = %d, %d; want 101, 251", f, l)
		}
		checkLog(t, s, entry(101))
		checkLog(t, s, entry(250))
	})
	t.Run("a gap after a snapshot restore: bounds follow the keys", func(t *testing.T) {
		if err := s.StoreLogs(entries(1000, 1002)); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteRange(0, 999); err != nil {
			t.Fatal(err)
		}
		if f, l := bounds(t, s); f != 1000 || l != 1002 {
			t.Fatalf("bounds = %d, %d; want 1000, 1002", f, l)
		}
	})
	t.Run("DeleteRange of everything empties it", func(t *testing.T) {
		if err := s.DeleteRange(0, ^uint64(0)); err != nil {
			t.Fatal(err)
		}
		if f, l := bounds(t, s); f != 0 || l != 0 {
			t.Fatalf("bounds = %d, %d; want 0, 0", f, l)
		}
		s2 := newRaftStore(t, st)
		if f, l := bounds(t, s2); f != 0 || l != 0 {
			t.Fatalf("bounds read back = %d, %d; want 0, 0", f, l)
		}
	})
}

// A batch larger than one Badger transaction (pi-zero: about 6,500
// entries) is written in parts; a single entry too large fails and leaves
// the log as it was.
func TestRaftStore_StoreLogsBeyondOneTransaction(t *testing.T) {
	st := openStore(t, "")
	s := newRaftStore(t, st)
	if err := st.KVWrite(logKVs(entries(1, 20000)), nil); !errors.Is(err, logstore.ErrRecordTooLarge) {
		t.Fatalf("one KVWrite of 20,000 entries = %v; the test needs it to exceed a transaction", err)
	}
	if err := s.StoreLogs(entries(1, 20000)); err != nil {
		t.Fatalf("StoreLogs of 20,000 entries: %v", err)
	}
	if f, l := bounds(t, s); f != 1 || l != 20000 {
		t.Fatalf("bounds = %d, %d; want 1, 20000", f, l)
	}
	checkLog(t, s, entry(12345))
	if err := s.DeleteRange(1, 19990); err != nil {
		t.Fatalf("DeleteRange of 19,990 entries: %v", err)
	}
	if f, l := bounds(t, s); f != 19991 || l != 20000 {
		t.Fatalf("bounds = %d, %d; want 19991, 20000", f, l)
	}

	huge := &raft.Log{Index: 20001, Term: 9, Data: make([]byte, 17<<20)}
	if err := s.StoreLog(huge); err == nil {
		t.Fatal("StoreLog of a 17 MiB entry succeeded on a 16 MiB value log")
	}
	if _, l := bounds(t, s); l != 20000 {
		t.Fatalf("last index after a failed store = %d, want 20000", l)
	}
}

func logKVs(ls []*raft.Log) []logstore.KV {
	kvs := make([]logstore.KV, len(ls))
	for i, l := range ls {
		kvs[i] = logstore.KV{Key: logKey(l.Index), Value: encodeLog(l)}
	}
	return kvs
}

func TestRaftStore_Stable(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	s := newRaftStore(t, st)

	// raft tells a missing key by the error's text (api.go, raft.go).
	if _, err := s.Get([]byte("LastVoteCand")); err == nil || err.Error() != "not found" {
		t.Fatalf("Get of a missing key = %v, want \"not found\"", err)
	}
	if _, err := s.GetUint64([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Fatalf("GetUint64 of a missing key = %v, want \"not found\"", err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("node-2")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 1<<40+7); err != nil {
		t.Fatal(err)
	}
	// Stable keys and log entries do not meet, whatever the key.
	if err := s.SetUint64(append([]byte{raftLogTag}, make([]byte, 8)...), 5); err != nil {
		t.Fatal(err)
	}
	if f, l := bounds(t, s); f != 0 || l != 0 {
		t.Fatalf("a stable key moved the log bounds to %d, %d", f, l)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = openStore(t, dir)
	s = newRaftStore(t, st)
	if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-2" {
		t.Fatalf("Get after reopen = %q, %v", v, err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 1<<40+7 {
		t.Fatalf("GetUint64 after reopen = %d, %v", v, err)
	}
	if err := s.Set([]byte("odd"), []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetUint64([]byte("odd")); err == nil {
		t.Fatal("GetUint64 of a 3-byte value succeeded")
	}
}

func FuzzDecodeLog(f *testing.F) {
	f.Add(encodeLog(entry(7)))
	f.Add(encodeLog(&raft.Log{}))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if err := decodeLog(b, &l); err != nil {
			return
		}
		l.Index = 0
		var back raft.Log
		if err := decodeLog(encodeLog(&l), &back); err != nil {
			t.Fatalf("re-encoded entry does not decode: %v", err)
		}
		if back.Term != l.Term || back.Type != l.Type || !bytes.Equal(back.Data, l.Data) ||
			!bytes.Equal(back.Extensions, l.Extensions) || !back.AppendedAt.Equal(l.AppendedAt) {
			t.Fatalf("round trip %+v -> %+v", l, back)
		}
	})
}
