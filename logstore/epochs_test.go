package logstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// appendInEpoch appends n records stamped with epoch e.
func appendInEpoch(tb testing.TB, s *Stream, e uint32, n int) {
	tb.Helper()
	s.SetEpoch(e)
	appendN(tb, s, n, 10)
}

type epochAnswer struct {
	ask, epoch uint32
	end        uint64
	ok         bool
}

func checkEpochs(tb testing.TB, s *Stream, want []epochAnswer) {
	tb.Helper()
	for _, w := range want {
		e, end, ok := s.EndOffsetForEpoch(w.ask)
		if e != w.epoch || end != w.end || ok != w.ok {
			tb.Errorf("EndOffsetForEpoch(%d) = %d, %d, %v; want %d, %d, %v", w.ask, e, end, ok, w.epoch, w.end, w.ok)
		}
	}
}

func TestStream_EpochCache(t *testing.T) {
	ctx := context.Background()
	top := t // stores opened in subtests live until the test ends
	cfg := testConfig(t)
	st := openStore(t, cfg)
	s := st.Stream("default")
	appendInEpoch(t, s, 1, 100) // [0, 100)
	appendInEpoch(t, s, 3, 50)  // [100, 150)
	appendInEpoch(t, s, 5, 50)  // [150, 200)
	answers := []epochAnswer{
		{0, 0, 0, true}, // below the earliest: the earliest's start, as Kafka answers
		{1, 1, 100, true},
		{2, 1, 100, true}, // an epoch with no records: the one before it, ending where the next starts
		{3, 3, 150, true},
		{4, 3, 150, true},
		{5, 5, 200, true}, // the latest: the log end
		{6, 0, 0, false},  // above the latest: unknown
	}
	checkEpochs(t, s, answers)

	t.Run("an append in an older epoch is refused", func(t *testing.T) {
		s.SetEpoch(4)
		if _, err := s.Append(ctx, rec("a", "stale")); !errors.Is(err, ErrStaleEpoch) {
			t.Fatalf("Append in epoch 4 after epoch 5 = %v, want ErrStaleEpoch", err)
		}
		if s.NextOffset() != 200 {
			t.Fatalf("next %d after a refused append, want 200", s.NextOffset())
		}
	})
	t.Run("survives a reopen, and appends go on in the latest epoch", func(t *testing.T) {
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st = openStore(top, cfg)
		s = st.Stream("default")
		checkEpochs(t, s, answers)
		if _, err := s.Append(ctx, rec("a", "after")); err != nil {
			t.Fatal(err)
		}
		if recs, _ := s.Read(200, 1, 0); len(recs) != 1 || recs[0].Epoch != 5 {
			t.Fatalf("record appended after a reopen = %v, want epoch 5", recs)
		}
	})
	t.Run("truncation trims it, across a reopen", func(t *testing.T) {
		if err := s.Truncate(ctx, 120); err != nil {
			t.Fatal(err)
		}
		trimmed := []epochAnswer{{1, 1, 100, true}, {3, 3, 120, true}, {5, 0, 0, false}}
		checkEpochs(t, s, trimmed)
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st = openStore(top, cfg)
		s = st.Stream("default")
		checkEpochs(t, s, trimmed)
		if e, start, ok := s.LatestEpoch(); e != 3 || start != 100 || !ok {
			t.Fatalf("LatestEpoch after Truncate(120) = %d, %d, %v; want 3, 100", e, start, ok)
		}
		appendInEpoch(t, s, 6, 40) // [120, 160): past where the truncated epoch 5 started
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st = openStore(top, cfg)
		s = st.Stream("default")
		checkEpochs(t, s, []epochAnswer{{3, 3, 120, true}, {5, 3, 120, true}, {6, 6, 160, true}})
		if err := s.Truncate(ctx, 100); err != nil { // exactly where epoch 3 starts
			t.Fatal(err)
		}
		checkEpochs(t, s, []epochAnswer{{1, 1, 100, true}, {3, 0, 0, false}})
	})
}

func TestStream_EpochCacheOfAReplica(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	st := openStore(t, cfg)
	s := st.Stream("default")
	var vals [][]byte
	for i, e := range []uint32{1, 1, 2, 2, 4} {
		v, _ := leaderValues(uint64(i), 1, e)
		vals = append(vals, v...)
	}
	if err := s.AppendReplica(ctx, 0, vals[:3]); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendReplica(ctx, 3, vals[3:]); err != nil {
		t.Fatal(err)
	}
	checkEpochs(t, s, []epochAnswer{{1, 1, 2, true}, {2, 2, 4, true}, {3, 2, 4, true}, {4, 4, 5, true}})
	back, _ := leaderValues(5, 2, 4)
	old, _ := leaderValues(7, 1, 3)
	if err := s.AppendReplica(ctx, 5, append(back, old...)); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("AppendReplica of epoch 3 after epoch 4 = %v, want ErrStaleEpoch", err)
	}
	if s.NextOffset() != 5 {
		t.Fatalf("next %d after a refused replica append, want 5", s.NextOffset())
	}
	// A follower after a leader change: the new leader (epoch 3) never had
	// offset 4 of epoch 4, the follower truncates and takes the new log.
	if err := s.Truncate(ctx, 4); err != nil {
		t.Fatal(err)
	}
	newer, _ := leaderValues(4, 3, 3)
	if err := s.AppendReplica(ctx, 4, newer); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, cfg).Stream("default")
	checkEpochs(t, s, []epochAnswer{{2, 2, 4, true}, {3, 3, 7, true}, {4, 0, 0, false}})
}

// Retention trims the cache as Kafka's truncateFromStart does: the epoch
// the new log start falls in starts there, older ones go, and an epoch the
// log no longer holds is answered as one below the cache.
func TestStream_EpochCacheUnderRetention(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "default", Filters: []string{"#"}, MaxAge: time.Hour})
	st := openStore(t, cfg)
	s := st.Stream("default")
	old := time.Now().Add(-2 * time.Hour).UnixMilli()
	for i, e := range []uint32{1, 2, 3} { // [0, 1000), [1000, 2000), [2000, 3000)
		s.SetEpoch(e)
		for j := 0; j < 1000; j += 100 {
			recs := make([]*Record, 100)
			for k := range recs {
				recs[k] = rec("t", "p")
				if i*1000+j+k < 1500 {
					recs[k].Timestamp = old
				}
			}
			if _, err := s.Append(context.Background(), recs...); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := s.ApplyRetention(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if s.FirstOffset() != 1500 {
		t.Fatalf("log start %d after retention, want 1500", s.FirstOffset())
	}
	want := []epochAnswer{{0, 0, 1500, true}, {1, 1, 1500, true}, {2, 2, 2000, true}, {3, 3, 3000, true}}
	checkEpochs(t, s, want)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	checkEpochs(t, openStore(t, cfg).Stream("default"), want)
}
