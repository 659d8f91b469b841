package logstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// hookShipped installs testHookShipped for one test.
func hookShipped(t *testing.T, f func() error) {
	t.Helper()
	testHookShipped = f
	t.Cleanup(func() { testHookShipped = nil })
}

// appendBg appends recs on a goroutine; the channel gives its result.
func appendBg(s *Stream, recs ...*Record) <-chan error {
	ch := make(chan error, 1)
	s.AppendAsync(recs, func(_ uint64, err error) { ch <- err })
	return ch
}

func shipRecs(prefix string, n int) []*Record {
	out := make([]*Record, n)
	for i := range out {
		out[i] = &Record{Topic: fmt.Sprintf("t/%s/%d", prefix, i), Payload: []byte(prefix), QoS: 1}
	}
	return out
}

// A leader's group commit is served to a follower's fetch (ReadRaw) while
// it is still being written, and is valid there: a follower's
// AppendReplica takes it. Read, NextOffset and the watermark do not move
// until it is written.
func TestStream_ShipsAGroupCommitWhileWritingIt(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, manualConfig(t)).Stream("default")
	appendN(t, s, 10, 10)
	follower := openStore(t, manualConfig(t)).Stream("default")
	base, err := s.ReadRaw(0, 0, 0)
	if err != nil || len(base) != 10 {
		t.Fatalf("ReadRaw(0) = %d values, %v", len(base), err)
	}
	if err := follower.AppendReplica(ctx, 0, base); err != nil {
		t.Fatal(err)
	}

	release := make(chan struct{})
	hookShipped(t, func() error { <-release; return nil })
	done := appendBg(s, shipRecs("a", 5)...)
	deadline := time.Now().Add(30 * time.Second)
	for s.ShipEnd() != 15 {
		if time.Now().After(deadline) {
			t.Fatalf("ShipEnd %d, want 15 while the commit is held", s.ShipEnd())
		}
		time.Sleep(time.Millisecond)
	}
	if s.NextOffset() != 10 {
		t.Fatalf("NextOffset %d while the commit is held, want 10", s.NextOffset())
	}
	vals, err := s.ReadRaw(8, 0, 0) // two stored, five being written
	if err != nil || len(vals) != 7 {
		close(release)
		t.Fatalf("ReadRaw(8) while the commit is held = %d values, %v; want 7", len(vals), err)
	}
	if err := follower.AppendReplica(ctx, 10, vals[2:]); err != nil {
		close(release)
		t.Fatalf("a follower's AppendReplica of the shipped values: %v", err)
	}
	if v, err := s.ReadRaw(12, 2, 0); err != nil || len(v) != 2 {
		close(release)
		t.Fatalf("ReadRaw(12, max 2) = %d values, %v; want 2", len(v), err)
	}
	if _, err := s.ReadRaw(16, 0, 0); !errors.Is(err, ErrOffsetOutOfRange) {
		close(release)
		t.Fatalf("ReadRaw(16) past ShipEnd = %v, want ErrOffsetOutOfRange", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s.NextOffset() != 15 || s.ShipEnd() != 15 {
		t.Fatalf("after the write NextOffset %d ShipEnd %d, want 15", s.NextOffset(), s.ShipEnd())
	}
	setHW(t, s, 15)
	setHW(t, follower, 15)
	got, want := readAll(t, follower, 0), readAll(t, s, 0)
	sameRecords(t, got, want)
}

// A shipped group commit that cannot be written leaves its offsets
// unused in that leader epoch: appends are refused (a follower may hold
// the shipped records at those offsets), until a new leader epoch.
func TestStream_FailedShippedCommitRefusesTheEpoch(t *testing.T) {
	s := openStore(t, manualConfig(t)).Stream("default")
	s.SetEpoch(3)
	appendN(t, s, 10, 10)
	hookShipped(t, func() error { return errors.New("disk on fire") })
	if err := <-appendBg(s, shipRecs("a", 5)...); err == nil {
		t.Fatal("the failed commit was answered without an error")
	}
	testHookShipped = nil
	if s.NextOffset() != 10 || s.ShipEnd() != 10 {
		t.Fatalf("after the failed write NextOffset %d ShipEnd %d, want 10", s.NextOffset(), s.ShipEnd())
	}
	if err := <-appendBg(s, shipRecs("b", 1)...); !errors.Is(err, ErrShippedUnwritten) {
		t.Fatalf("an append in the same epoch = %v, want ErrShippedUnwritten", err)
	}
	s.SetEpoch(4)
	if err := <-appendBg(s, shipRecs("c", 1)...); err != nil {
		t.Fatalf("an append in a new epoch: %v", err)
	}
	if s.NextOffset() != 11 {
		t.Fatalf("NextOffset %d, want 11", s.NextOffset())
	}
}

// Without ManualCommit (a single node) nothing is shipped early.
func TestStream_NoShippingOnASingleNode(t *testing.T) {
	s := openStore(t, testConfig(t)).Stream("default")
	called := false
	hookShipped(t, func() error { called = true; return nil })
	appendN(t, s, 5, 5)
	if called {
		t.Fatal("a single node's group commit was shipped early")
	}
}
