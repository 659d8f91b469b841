package logstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func manualConfig(tb testing.TB) Config {
	cfg := testConfig(tb)
	cfg.ManualCommit = true
	return cfg
}

func setHW(tb testing.TB, s *Stream, hw uint64) {
	tb.Helper()
	if err := s.SetHighWatermark(context.Background(), hw); err != nil {
		tb.Fatalf("SetHighWatermark(%d): %v", hw, err)
	}
}

func TestStream_HighWatermark(t *testing.T) {
	ctx := context.Background()
	top := t
	cfg := manualConfig(t)
	st := openStore(t, cfg)
	s := st.Stream("default")
	appendN(t, s, 100, 10)
	reopen := func() {
		if err := st.Close(); err != nil {
			top.Fatal(err)
		}
		st = openStore(top, cfg)
		s = st.Stream("default")
	}

	t.Run("moves up only, capped at the log end", func(t *testing.T) {
		if s.Committed() != 0 {
			t.Fatalf("Committed %d before any SetHighWatermark, want 0", s.Committed())
		}
		setHW(t, s, 60)
		if recs, err := s.Read(0, 0, 0); err != nil || len(recs) != 60 || s.Committed() != 60 {
			t.Fatalf("after SetHighWatermark(60): Committed %d, Read %d records, %v", s.Committed(), len(recs), err)
		}
		setHW(t, s, 500)
		if s.Committed() != 100 {
			t.Fatalf("SetHighWatermark(500) with log end 100 gave %d", s.Committed())
		}
		setHW(t, s, 10)
		if s.Committed() != 100 {
			t.Fatalf("SetHighWatermark(10) moved the watermark down to %d", s.Committed())
		}
	})
	t.Run("survives a reopen instead of falling back to the log start", func(t *testing.T) {
		appendN(t, s, 50, 10) // [100, 150), not committed
		setHW(t, s, 120)
		reopen()
		if s.Committed() != 120 || s.NextOffset() != 150 {
			t.Fatalf("after reopen Committed %d next %d, want 120 and 150", s.Committed(), s.NextOffset())
		}
		if recs := readAll(t, s, 0); len(recs) != 120 {
			t.Fatalf("after reopen read %d records, want 120", len(recs))
		}
	})
	t.Run("truncation below it is refused", func(t *testing.T) {
		if err := s.Truncate(ctx, 119); !errors.Is(err, ErrBelowHighWatermark) {
			t.Fatalf("Truncate(119) below a watermark of 120 = %v, want ErrBelowHighWatermark", err)
		}
		if s.NextOffset() != 150 {
			t.Fatalf("next %d after a refused truncation, want 150", s.NextOffset())
		}
		if err := s.Truncate(ctx, 120); err != nil || s.NextOffset() != 120 || s.Committed() != 120 {
			t.Fatalf("Truncate(120) = %v, next %d committed %d", err, s.NextOffset(), s.Committed())
		}
	})
}

// A single node's watermark follows the durable log end, as before, and is
// the log end after a reopen; SetHighWatermark does nothing there.
func TestStream_HighWatermarkOfASingleNode(t *testing.T) {
	cfg := testConfig(t)
	st := openStore(t, cfg)
	s := st.Stream("default")
	appendN(t, s, 30, 10)
	setHW(t, s, 10)
	if s.Committed() != 30 {
		t.Fatalf("Committed %d, want the log end 30", s.Committed())
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if s2 := openStore(t, cfg).Stream("default"); s2.Committed() != 30 {
		t.Fatalf("after reopen Committed %d, want 30", s2.Committed())
	}
}

func TestStream_ResetTo(t *testing.T) {
	for _, c := range []struct {
		manual bool
		at     uint64
	}{{false, 70_000}, {true, 70_000}, {false, 3000}, {true, 3000}} {
		manual, at := c.manual, c.at // 3000: the log end, inside the chunk of the last records
		name := fmt.Sprintf("%s/at %d", map[bool]string{false: "single node", true: "ManualCommit"}[manual], at)
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cfg := testConfig(t)
			cfg.ManualCommit = manual
			st := openStore(t, cfg)
			s := st.Stream("default")
			appendInEpoch(t, s, 2, 3000)
			setHW(t, s, 3000)
			if err := s.ResetTo(ctx, 2999); !errors.Is(err, ErrOffsetOutOfRange) {
				t.Fatalf("ResetTo below the log end = %v, want ErrOffsetOutOfRange", err)
			}
			if err := s.ResetTo(ctx, at); err != nil {
				t.Fatal(err)
			}
			check := func(s *Stream, next, committed uint64) {
				t.Helper()
				if s.FirstOffset() != at || s.NextOffset() != next || s.Committed() != committed {
					t.Fatalf("first %d next %d committed %d, want %d, %d, %d", s.FirstOffset(), s.NextOffset(), s.Committed(), at, next, committed)
				}
				if _, err := s.Read(2999, 1, 0); !errors.Is(err, ErrOffsetOutOfRange) {
					t.Fatalf("Read of a record before the reset = %v, want ErrOffsetOutOfRange", err)
				}
			}
			for range 2 { // after the reset, and after a reopen
				check(s, at, at)
				if s.Bytes() != 0 {
					t.Fatalf("Bytes %d after a reset, want 0", s.Bytes())
				}
				if _, _, ok := s.LatestEpoch(); ok {
					t.Fatal("the epoch cache outlived the reset")
				}
				if err := st.Close(); err != nil {
					t.Fatal(err)
				}
				st = openStore(t, cfg)
				s = st.Stream("default")
			}
			vals, want := leaderValues(at, 20, 9)
			if err := s.AppendReplica(ctx, at, vals); err != nil {
				t.Fatal(err)
			}
			setHW(t, s, at+10)
			committed := map[bool]uint64{false: at + 20, true: at + 10}[manual]
			check(s, at+20, committed)
			bytes := s.Bytes()
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, cfg).Stream("default")
			check(s, at+20, committed)
			if s.Bytes() != bytes {
				t.Fatalf("after reopen Bytes %d, want %d", s.Bytes(), bytes)
			}
			if vals, err := s.ReadRaw(at, 0, 0); err != nil || len(vals) != 20 {
				t.Fatalf("ReadRaw after reopen = %d values, %v", len(vals), err)
			}
			sameRecords(t, readAll(t, s, at), want[:committed-at])
			checkEpochs(t, s, []epochAnswer{{2, 2, at, true}, {9, 9, at + 20, true}})
		})
	}
}
