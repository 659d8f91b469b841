package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
)

// fakeRecord is one record of a fake stream.
type fakeRecord struct {
	offset  int64
	topic   string
	payload string
}

// fakeStream is n records on a few topics with values that add up exactly
// in float64 (multiples of 0.25), and the aggregates of one clean pass.
func fakeStream(rng *rand.Rand, n int) ([]fakeRecord, map[string]Aggregate) {
	recs := make([]fakeRecord, n)
	want := make(map[string]Aggregate)
	for i := range recs {
		topic := fmt.Sprintf("sensors/%d/temp", rng.IntN(4))
		v := float64(rng.IntN(8001)-4000) / 4
		recs[i] = fakeRecord{offset: int64(i), topic: topic, payload: fmt.Sprint(v)}
		want[topic] = add(want[topic], v)
	}
	return recs, want
}

// add is the reference aggregation the store must match.
func add(a Aggregate, v float64) Aggregate {
	if a.Count == 0 {
		return Aggregate{Count: 1, Sum: v, Min: v, Max: v}
	}
	a.Count++
	a.Sum += v
	a.Min, a.Max = min(a.Min, v), max(a.Max, v)
	return a
}

func openTestStore(t testing.TB, path string) *Store {
	t.Helper()
	s, err := OpenStore(path, "sensors/#")
	if err != nil {
		t.Fatalf("OpenStore: %v", err)
	}
	return s
}

func aggregates(t testing.TB, s *Store) map[string]Aggregate {
	t.Helper()
	got, err := s.Aggregates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestStore_ExactlyOnceAcrossCrashes applies a stream from a source that
// redelivers (at-least-once) and "crashes" the consumer at random points:
// the store is dropped without Close and reopened, and the source resumes
// at the stored position, sometimes with an overlap of records already
// applied. The result must equal one clean pass.
func TestStore_ExactlyOnceAcrossCrashes(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	recs, want := fakeStream(rng, 1000)
	path := filepath.Join(t.TempDir(), "agg.db")

	next := 0 // the source's next record: where the broker would start
	for crash := 0; next < len(recs); crash++ {
		s := openTestStore(t, path)
		from := s.Resume()
		if want := "earliest"; next == 0 && from != want {
			t.Fatalf("empty store resumes from %q, want %q", from, want)
		} else if next > 0 && from != fmt.Sprint(next) {
			t.Fatalf("after %d records the store resumes from %q, want %d", next, from, next)
		}
		// The source resends up to 20 records before the resume point.
		start := max(0, next-rng.IntN(21))
		stop := min(len(recs), next+rng.IntN(600)+1)
		for _, r := range recs[start:stop] {
			if err := s.Apply(ctx, r.offset, r.topic, []byte(r.payload)); err != nil {
				t.Fatalf("Apply offset %d: %v", r.offset, err)
			}
		}
		next = stop
		if crash%2 == 0 {
			s.Close()
		} // else: dropped open, as a killed process leaves it
	}
	s := openTestStore(t, path)
	defer s.Close()
	if got := aggregates(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("aggregates after crashes and redeliveries:\n got %v\nwant %v", got, want)
	}
}

func TestStore_SkipsWhatItCannotAdd(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t, filepath.Join(t.TempDir(), "agg.db"))
	defer s.Close()
	if err := s.Apply(ctx, 7, "a", []byte("2.5")); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, 8, "a", []byte("warm")); !errors.Is(err, ErrNotNumber) {
		t.Errorf("Apply of a non-number = %v, want ErrNotNumber", err)
	}
	if got, want := s.Resume(), "9"; got != want {
		t.Errorf("after a skipped record Resume() = %q, want %q (the record is consumed)", got, want)
	}
	want := map[string]Aggregate{"a": {Count: 1, Sum: 2.5, Min: 2.5, Max: 2.5}}
	if got := aggregates(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("aggregates = %v, want %v", got, want)
	}
}

func TestStore_RefusesAnotherFilter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agg.db")
	s := openTestStore(t, path)
	if err := s.Apply(context.Background(), 0, "sensors/a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err := OpenStore(path, "meters/#"); err == nil {
		s.Close()
		t.Fatal("OpenStore with another filter succeeded; its offsets would be meaningless")
	}
}
