package logstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	badger "github.com/dgraph-io/badger/v4"
)

// leaderValues returns the stored values of n records at offsets from,
// from+1, ... written by a leader in epoch (what ReadRaw of a leader
// returns), and the records they hold.
func leaderValues(from uint64, n int, epoch uint32) ([][]byte, []*Record) {
	vals := make([][]byte, n)
	recs := make([]*Record, n)
	for i := range n {
		off := from + uint64(i)
		r := &Record{Offset: off, Timestamp: 1_700_000_000_000 + int64(off), Topic: fmt.Sprintf("t/%d", off),
			Payload: []byte(fmt.Sprintf("p%d", off)), QoS: 1, ClientID: "leader", Epoch: epoch}
		vals[i], recs[i] = encodeRecord(nil, r), r
	}
	return vals, recs
}

// sameRecords fails unless got holds want's offsets, timestamps, epochs,
// topics and payloads.
func sameRecords(tb testing.TB, got, want []*Record) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Offset != w.Offset || g.Timestamp != w.Timestamp || g.Epoch != w.Epoch || g.Topic != w.Topic || string(g.Payload) != string(w.Payload) {
			tb.Fatalf("record %d = {%d %d e%d %q %q}, want {%d %d e%d %q %q}", i,
				g.Offset, g.Timestamp, g.Epoch, g.Topic, g.Payload, w.Offset, w.Timestamp, w.Epoch, w.Topic, w.Payload)
		}
	}
}

func TestStream_AppendReplica(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	st := openStore(t, cfg)
	s := st.Stream("default")
	vals, want := leaderValues(0, 3000, 4)

	t.Run("keeps the leader's offsets, timestamps and epochs", func(t *testing.T) {
		// 1500 then 1500: the second call starts inside a chunk and crosses two.
		for _, part := range [][2]int{{0, 1500}, {1500, 3000}} {
			if err := s.AppendReplica(ctx, uint64(part[0]), vals[part[0]:part[1]]); err != nil {
				t.Fatalf("AppendReplica(%d): %v", part[0], err)
			}
		}
		if s.NextOffset() != 3000 || s.Committed() != 3000 {
			t.Fatalf("next %d committed %d, want 3000", s.NextOffset(), s.Committed())
		}
		sameRecords(t, readAll(t, s, 0), want)
	})
	t.Run("refuses a base other than the log end", func(t *testing.T) {
		more, _ := leaderValues(2999, 2, 4)
		if err := s.AppendReplica(ctx, 2999, more); !errors.Is(err, ErrNotAtLogEnd) {
			t.Fatalf("AppendReplica(2999) at log end 3000 = %v, want ErrNotAtLogEnd", err)
		}
		more, _ = leaderValues(3001, 2, 4)
		if err := s.AppendReplica(ctx, 3001, more); !errors.Is(err, ErrNotAtLogEnd) {
			t.Fatalf("AppendReplica(3001) at log end 3000 = %v, want ErrNotAtLogEnd", err)
		}
		if s.NextOffset() != 3000 {
			t.Fatalf("next %d after refused appends, want 3000", s.NextOffset())
		}
	})
	t.Run("refuses a value for another offset and writes nothing of the call", func(t *testing.T) {
		more, _ := leaderValues(3000, 3, 4)
		shifted, _ := leaderValues(3004, 1, 4) // a valid value, for offset 3004
		more[2] = shifted[0]
		var ce *CorruptError
		if err := s.AppendReplica(ctx, 3000, more); !errors.As(err, &ce) || ce.Offset != 3002 {
			t.Fatalf("AppendReplica with offset 3004's value at 3002 = %v, want CorruptError at 3002", err)
		}
		if s.NextOffset() != 3000 {
			t.Fatalf("next %d after a refused call, want 3000", s.NextOffset())
		}
	})
	t.Run("refuses a damaged value", func(t *testing.T) {
		more, _ := leaderValues(3000, 1, 4)
		more[0][len(more[0])-1] ^= 1
		if err := s.AppendReplica(ctx, 3000, more); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("AppendReplica of a damaged value = %v, want ErrCorrupt", err)
		}
	})
	t.Run("stays after a reopen", func(t *testing.T) {
		bytes := s.Bytes()
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		s2 := openStore(t, cfg).Stream("default")
		if s2.NextOffset() != 3000 || s2.Bytes() != bytes {
			t.Fatalf("after reopen next %d bytes %d, want 3000 and %d", s2.NextOffset(), s2.Bytes(), bytes)
		}
		sameRecords(t, readAll(t, s2, 0), want)
	})
}

// readRawAll reads [from, NextOffset()) with ReadRaw in pages of max.
func readRawAll(tb testing.TB, s *Stream, from uint64, max int) [][]byte {
	tb.Helper()
	var out [][]byte
	for from < s.NextOffset() {
		vals, err := s.ReadRaw(from, max, 0)
		if err != nil {
			tb.Fatalf("ReadRaw(%d): %v", from, err)
		}
		if len(vals) == 0 {
			tb.Fatalf("ReadRaw(%d) returned nothing below NextOffset %d", from, s.NextOffset())
		}
		out = append(out, vals...)
		from += uint64(len(vals))
	}
	return out
}

func TestStream_ReadRaw(t *testing.T) {
	ctx := context.Background()
	lcfg := testConfig(t)
	lcfg.ManualCommit = true // a leader: nothing committed until the ISR has it
	leader := openStore(t, lcfg)
	ls := leader.Stream("default")
	ls.SetEpoch(2)
	appendN(t, ls, 2500, 100)
	fcfg := testConfig(t)
	fs := openStore(t, fcfg).Stream("default")

	t.Run("reads past the high watermark to the log end", func(t *testing.T) {
		if recs, err := ls.Read(0, 0, 0); err != nil || len(recs) != 0 {
			t.Fatalf("Read below a high watermark of 0 = %d records, %v", len(recs), err)
		}
		vals, err := ls.ReadRaw(0, 0, 0)
		if err != nil || len(vals) != 2500 {
			t.Fatalf("ReadRaw(0) = %d values, %v; want 2500", len(vals), err)
		}
	})
	t.Run("a follower appending what it reads holds the leader's records byte for byte", func(t *testing.T) {
		for from := uint64(0); from < ls.NextOffset(); {
			vals, err := ls.ReadRaw(from, 700, 0)
			if err != nil || len(vals) == 0 {
				t.Fatalf("ReadRaw(%d) = %d values, %v", from, len(vals), err)
			}
			if err := fs.AppendReplica(ctx, from, vals); err != nil {
				t.Fatal(err)
			}
			from += uint64(len(vals))
		}
		lv, fv := readRawAll(t, ls, 0, 333), readRawAll(t, fs, 0, 1000)
		if len(lv) != 2500 || len(fv) != 2500 {
			t.Fatalf("leader %d values, follower %d, want 2500", len(lv), len(fv))
		}
		for i := range lv {
			if string(lv[i]) != string(fv[i]) {
				t.Fatalf("value %d differs between leader and follower", i)
			}
		}
		setHW(t, ls, 2500)
		sameRecords(t, readAll(t, fs, 0), readAll(t, ls, 0))
	})
	t.Run("bounds", func(t *testing.T) {
		if vals, err := ls.ReadRaw(2500, 0, 0); err != nil || len(vals) != 0 {
			t.Fatalf("ReadRaw at the log end = %d values, %v; want none", len(vals), err)
		}
		if _, err := ls.ReadRaw(2501, 0, 0); !errors.Is(err, ErrOffsetOutOfRange) {
			t.Fatalf("ReadRaw past the log end = %v, want ErrOffsetOutOfRange", err)
		}
		if vals, err := ls.ReadRaw(10, 0, 1); err != nil || len(vals) != 1 {
			t.Fatalf("ReadRaw with maxBytes 1 = %d values, %v; want 1", len(vals), err)
		}
		three, _ := ls.ReadRaw(10, 3, 0)
		size := len(three[0]) + len(three[1]) + len(three[2])
		if vals, err := ls.ReadRaw(10, 0, size); err != nil || len(vals) != 3 {
			t.Fatalf("ReadRaw with maxBytes of three values = %d values, %v; want 3", len(vals), err)
		}
		if vals, err := ls.ReadRaw(10, 2, size); err != nil || len(vals) != 2 {
			t.Fatalf("ReadRaw with max 2 = %d values, %v; want 2", len(vals), err)
		}
	})
	t.Run("after a reopen", func(t *testing.T) {
		before := readRawAll(t, ls, 0, 0)
		if err := leader.Close(); err != nil {
			t.Fatal(err)
		}
		after := readRawAll(t, openStore(t, lcfg).Stream("default"), 0, 0)
		if len(after) != len(before) {
			t.Fatalf("after reopen %d values, want %d", len(after), len(before))
		}
		for i := range before {
			if string(after[i]) != string(before[i]) {
				t.Fatalf("value %d changed across a reopen", i)
			}
		}
	})
}

// A leader reports a damaged record of its own instead of shipping it.
func TestStream_ReadRawReportsCorruption(t *testing.T) {
	st := openStore(t, testConfig(t))
	s := st.Stream("default")
	appendN(t, s, 10, 10)
	isolate(t, s, 6)
	bad := append([]byte{valueVersion, 0, 0, 0, 0}, 0x93, 0xc1, 0xc1, 0xc1)
	if err := st.db.Update(func(txn *badger.Txn) error { return txn.Set(recordKey(s.id, 6), bad) }); err != nil {
		t.Fatal(err)
	}
	if vals, err := s.ReadRaw(0, 0, 0); err != nil || len(vals) != 6 {
		t.Fatalf("ReadRaw(0) = %d values, %v; want the 6 before the damaged one", len(vals), err)
	}
	var ce *CorruptError
	if _, err := s.ReadRaw(6, 0, 0); !errors.As(err, &ce) || ce.Offset != 6 {
		t.Fatalf("ReadRaw(6) = %v, want CorruptError at 6", err)
	}
	if vals, err := s.ReadRaw(7, 0, 0); err != nil || len(vals) != 3 {
		t.Fatalf("ReadRaw(7) past the damage = %d values, %v; want 3", len(vals), err)
	}
}

// A raw read running into a truncation is out of range, never corrupt: the
// log end goes down before the batches do. Small memtables make a
// truncation of a hundred batches take several transactions.
func TestStream_ReadRawDuringTruncation(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "default", Filters: []string{"#"}, Durability: DurabilityInterval})
	cfg.tune = func(p *profileSpec) { p.memTableSize = 96 << 10 }
	st := openStore(t, cfg)
	if st.txnCount/2 >= 200 {
		t.Fatalf("%d deletes per transaction: a truncation would be one", st.txnCount/2)
	}
	s := st.Stream("default")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	var reads atomic.Int64
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			from := s.NextOffset() - min(s.NextOffset(), 50) // right below the end, where the truncation cuts
			vals, err := s.ReadRaw(from, 0, 0)
			if err != nil && !errors.Is(err, ErrOffsetOutOfRange) {
				t.Errorf("ReadRaw(%d) during a truncation: %v", from, err)
				cancel()
				return
			}
			reads.Add(int64(len(vals)))
		}
	}()
	for i := 0; i < 20 && ctx.Err() == nil; i++ {
		appendN(t, s, 800, 4) // batches of 4: a truncation deletes 200
		if err := s.Truncate(context.Background(), s.NextOffset()-800); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	<-done
	if reads.Load() == 0 {
		t.Fatal("the reader never read a value")
	}
}
