package logstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
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
