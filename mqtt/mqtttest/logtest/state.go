package logtest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// loadState returns every entry under prefix, and the keys in the order fn
// saw them.
func loadState(t *testing.T, st mqtt.StateStore, prefix string) (map[string]string, []string) {
	t.Helper()
	m := map[string]string{}
	var order []string
	if err := st.LoadState(prefix, func(k string, v []byte) error {
		m[k] = string(v)
		order = append(order, k)
		return nil
	}); err != nil {
		t.Fatalf("LoadState(%q): %v", prefix, err)
	}
	return m, order
}

// testState: puts, deletes, prefixes, key order, fn's error, and values
// the caller reuses.
func testState(t *testing.T, s Suite) {
	l, _ := s.open(t, "default=#")
	st := l.State()
	if m, _ := loadState(t, st, ""); len(m) != 0 {
		t.Fatalf("new log holds state %v", m)
	}
	buf := []byte("v1")
	if err := st.WriteState(map[string][]byte{"g/b": buf, "g/a": []byte("va"), "s/x": []byte("sx"), "gone": []byte("x")}, nil); err != nil {
		t.Fatalf("WriteState: %v", err)
	}
	copy(buf, "XX") // the caller may reuse its values
	m, order := loadState(t, st, "g/")
	if !maps.Equal(m, map[string]string{"g/a": "va", "g/b": "v1"}) {
		t.Fatalf(`LoadState("g/") = %v, want g/a=va g/b=v1`, m)
	}
	if !slices.Equal(order, []string{"g/a", "g/b"}) {
		t.Fatalf("LoadState order %v, want key order", order)
	}

	// One call puts, overwrites and deletes; a key put and deleted ends deleted.
	if err := st.WriteState(map[string][]byte{"g/a": []byte("va2"), "both": []byte("x")}, []string{"gone", "both", "never"}); err != nil {
		t.Fatalf("WriteState: %v", err)
	}
	m, order = loadState(t, st, "")
	if !maps.Equal(m, map[string]string{"g/a": "va2", "g/b": "v1", "s/x": "sx"}) {
		t.Fatalf("LoadState after puts and deletes = %v", m)
	}
	if !slices.IsSorted(order) {
		t.Fatalf("LoadState order %v, want key order", order)
	}

	stop := errors.New("stop here")
	calls := 0
	err := st.LoadState("", func(string, []byte) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("LoadState with fn failing: err %v after %d calls, want fn's error after 1", err, calls)
	}
}

// testStateLimit: MaxStateWrite entries go in one call; one more is
// refused and changes nothing.
func testStateLimit(t *testing.T, s Suite) {
	l, _ := s.open(t, "default=#")
	st := l.State()
	puts := map[string][]byte{}
	for i := range logstore.MaxStateWrite {
		puts[fmt.Sprintf("k/%05d", i)] = []byte("v")
	}
	if err := st.WriteState(puts, nil); err != nil {
		t.Fatalf("WriteState of MaxStateWrite entries: %v", err)
	}
	if err := st.WriteState(map[string][]byte{"new": []byte("v")}, slices.Collect(maps.Keys(puts))); err == nil {
		t.Fatal("WriteState of MaxStateWrite+1 entries succeeded, want refused")
	}
	if m, _ := loadState(t, st, ""); len(m) != logstore.MaxStateWrite || m["new"] != "" {
		t.Fatalf("a refused WriteState changed the state: %d entries", len(m))
	}
}

// testClose: after close, appends fail with ErrClosed, Changed is closed
// and stays so, Read and state fail with ErrClosed; the appends in flight
// at close each get one done, in order; close is idempotent.
func testClose(t *testing.T, s Suite) {
	l, st, closeLog := s.stream(t)
	mustAppend(t, st, recs(3)...)
	ch := st.Changed()

	const n = 50
	var mu sync.Mutex
	var got []result
	all := make(chan struct{})
	for range n {
		st.AppendAsync(recs(1), func(first uint64, err error) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, result{first, err})
			if len(got) == n {
				close(all) // a call too many panics here
			}
		})
	}
	if err := closeLog(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := closeLog(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	waitClosed(t, "after close", ch)
	if !isClosed(st.Changed()) {
		t.Fatal("Changed() after close returned an open channel")
	}
	select {
	case <-all:
	case <-time.After(Deadline):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d appends in flight at close were told", len(got), n)
	}
	mu.Lock()
	next := uint64(3)
	for i, r := range got {
		switch {
		case r.err == nil && r.first != next:
			t.Errorf("append %d in flight at close: first %d, want %d", i, r.first, next)
		case r.err == nil:
			next++
		case !errors.Is(r.err, logstore.ErrClosed):
			t.Errorf("append %d in flight at close: err %v, want nil or ErrClosed", i, r.err)
		}
	}
	mu.Unlock()

	r := appendWait(t, st, recs(1)...)
	wantErr(t, "append after close", r.err, logstore.ErrClosed)
	_, err := st.Read(0, 1, 0)
	wantErr(t, "Read after close", err, logstore.ErrClosed)
	err = l.State().WriteState(map[string][]byte{"k": []byte("v")}, nil)
	wantErr(t, "WriteState after close", err, logstore.ErrClosed)
	err = l.State().LoadState("", func(string, []byte) error { return nil })
	wantErr(t, "LoadState after close", err, logstore.ErrClosed)
}

// testReopen: a closed log reopened on its dir holds its records, offsets,
// log start and state, and goes on appending where it stopped. Reads then
// come from storage, not from what the first instance cached.
func testReopen(t *testing.T, s Suite) {
	dir := t.TempDir()
	specs := []string{"default=#", "other=o/#", "gone=g/#"}
	l, closeLog := s.openIn(t, dir, specs...)
	st, other := l.Route("x"), l.Route("o/x")
	want := timed(testBase, 10) // the layout checkReadLimits expects
	want = append(want, rec("big", 1000), rec("after", 100))
	mustAppend(t, st, want[:4]...)
	mustAppend(t, st, want[4:]...)
	mustAppend(t, other, timed(testBase, 3)...)
	gone := l.Route("g/x")
	mustAppend(t, gone, timed(testBase, 4)...)
	var first, goneFirst uint64
	if s.Expire != nil {
		s.Expire(t, other, testBase.Add(5*time.Millisecond)) // drops offset 0
		s.Expire(t, gone, testBase.Add(time.Hour))           // drops every record
		first, goneFirst = 1, 4
	}
	if err := l.State().WriteState(map[string][]byte{"g/a": []byte("1"), "g/b": []byte("2"), "s/c": []byte("3")}, nil); err != nil {
		t.Fatalf("WriteState: %v", err)
	}
	if err := l.State().WriteState(nil, []string{"g/b"}); err != nil {
		t.Fatalf("WriteState: %v", err)
	}
	if err := other.WriteState(map[string][]byte{"g/a": []byte("o1")}, nil); err != nil {
		t.Fatalf("stream WriteState: %v", err)
	}
	if err := closeLog(); err != nil {
		t.Fatalf("close: %v", err)
	}

	l, _ = s.openIn(t, dir, specs...)
	st, other, gone = l.Route("x"), l.Route("o/x"), l.Route("g/x")
	if name(st) != "default" || name(other) != "other" || name(gone) != "gone" {
		t.Fatalf("reopened log routes x, o/x, g/x to %s, %s, %s", name(st), name(other), name(gone))
	}
	if got := st.Committed(); got != uint64(len(want)) {
		t.Fatalf("reopened Committed %d, want %d", got, len(want))
	}
	checkOffsets(t, readAll(t, st, 0), 0, want)
	checkReadLimits(t, st, want)
	if off, err := st.OffsetForTime(testBase.Add(35 * time.Millisecond)); err != nil || off != 4 {
		t.Fatalf("reopened OffsetForTime(+35ms) = %d, %v; want 4", off, err)
	}
	if f := mustAppend(t, st, recs(1)...); f != uint64(len(want)) {
		t.Fatalf("append after reopen: first %d, want %d", f, len(want))
	}
	if got := other.FirstOffset(); got != first {
		t.Fatalf("reopened FirstOffset %d, want %d", got, first)
	}
	if got := other.Committed(); got != 3 {
		t.Fatalf("reopened Committed of other %d, want 3", got)
	}
	// A stream retention emptied keeps its offsets: they never repeat.
	if f, c := gone.FirstOffset(), gone.Committed(); f != goneFirst || c != 4 {
		t.Fatalf("reopened emptied stream: FirstOffset %d Committed %d, want %d 4", f, c, goneFirst)
	}
	if f := mustAppend(t, gone, recs(1)...); f != 4 {
		t.Fatalf("append to a reopened emptied stream: first %d, want 4", f)
	}
	if m, _ := loadState(t, l.State(), ""); !maps.Equal(m, map[string]string{"g/a": "1", "s/c": "3"}) {
		t.Fatalf("reopened state %v, want g/a=1 s/c=3", m)
	}
	if m, _ := loadState(t, other, ""); !maps.Equal(m, map[string]string{"g/a": "o1"}) {
		t.Fatalf("reopened stream state %v, want g/a=o1", m)
	}
}

// testStreamState: a stream's state is its own (neither another stream
// nor the log's State sees it), with StateStore's promises; closing the
// log ends it.
func testStreamState(t *testing.T, s Suite) {
	l, closeLog := s.open(t, "a=a/#", "b=b/#")
	a, b := l.Stream("a"), l.Stream("b")
	if err := a.WriteState(map[string][]byte{"g/y": []byte("2"), "g/x": []byte("1"), "s/c": []byte("3")}, nil); err != nil {
		t.Fatalf("WriteState: %v", err)
	}
	if err := b.WriteState(map[string][]byte{"g/x": []byte("b1")}, nil); err != nil {
		t.Fatalf("WriteState: %v", err)
	}
	if err := a.WriteState(map[string][]byte{"g/y": []byte("4"), "both": []byte("x")}, []string{"s/c", "both"}); err != nil {
		t.Fatalf("WriteState: %v", err)
	}
	m, order := loadState(t, a, "")
	if !maps.Equal(m, map[string]string{"g/x": "1", "g/y": "4"}) || !slices.Equal(order, []string{"g/x", "g/y"}) {
		t.Fatalf("stream a's state %v (order %v), want g/x=1 g/y=4 in key order", m, order)
	}
	if m, _ := loadState(t, b, "g/"); !maps.Equal(m, map[string]string{"g/x": "b1"}) {
		t.Fatalf("stream b's state %v, want g/x=b1 only", m)
	}
	if m, _ := loadState(t, l.State(), ""); len(m) != 0 {
		t.Fatalf("the log's state sees streams' state: %v", m)
	}
	select {
	case <-a.StateMoved():
		t.Fatal("StateMoved fired for the stream's own writes")
	default:
	}
	big := map[string][]byte{}
	for i := range logstore.MaxStateWrite + 1 {
		big[strconv.Itoa(i)] = []byte{1}
	}
	if err := a.WriteState(big, nil); err == nil {
		t.Fatalf("stream WriteState of %d entries succeeded", len(big))
	}
	if err := closeLog(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := a.WriteState(map[string][]byte{"g/z": {1}}, nil); !errors.Is(err, logstore.ErrClosed) {
		t.Fatalf("stream WriteState after close = %v, want ErrClosed", err)
	}
	if err := a.LoadState("", func(string, []byte) error { return nil }); !errors.Is(err, logstore.ErrClosed) {
		t.Fatalf("stream LoadState after close = %v, want ErrClosed", err)
	}
}

// testClaim: one holder per key and stream.
func testClaim(t *testing.T, s Suite) {
	l, _ := s.open(t, "a=a/#", "b=b/#")
	a, b := l.Stream("a"), l.Stream("b")
	if ok, h := a.Claim("g/x", "c1"); !ok || h != "c1" {
		t.Fatalf("first Claim = %v %q, want granted", ok, h)
	}
	if ok, h := a.Claim("g/x", "c2"); ok || h != "c1" {
		t.Fatalf("Claim of a held key = %v %q, want refused naming c1", ok, h)
	}
	if ok, _ := a.Claim("g/x", "c1"); !ok {
		t.Fatal("the holder's second Claim refused")
	}
	if ok, _ := b.Claim("g/x", "c2"); !ok {
		t.Fatal("Claim of the same key in another stream refused")
	}
	a.Unclaim("g/x", "c2")
	if ok, h := a.Claim("g/x", "c2"); ok || h != "c1" {
		t.Fatalf("after Unclaim by a non-holder, Claim = %v %q, want refused naming c1", ok, h)
	}
	a.Unclaim("g/x", "c1")
	if ok, _ := a.Claim("g/x", "c2"); !ok {
		t.Fatal("Claim after the holder's Unclaim refused")
	}
}

// testCloseRacing: closing while appenders, readers and state writers run
// ends each of them with a result or logstore.ErrClosed, never a panic or
// a hang, and every done is called once.
func testCloseRacing(t *testing.T, s Suite) {
	l, st, closeLog := s.stream(t)
	mustAppend(t, st, recs(10)...)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	report := func(what string, err error) {
		select {
		case errs <- fmt.Errorf("%s: %w", what, err):
		default:
		}
	}
	var mu sync.Mutex
	sent, told := 0, 0
	wg.Add(3)
	go func() { // appender
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			sent++
			mu.Unlock()
			st.AppendAsync(recs(2), func(_ uint64, err error) {
				mu.Lock()
				told++
				mu.Unlock()
				if err != nil && !errors.Is(err, logstore.ErrClosed) {
					report("append", err)
				}
			})
		}
	}()
	go func() { // reader
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := st.Read(st.FirstOffset(), 5, 0); err != nil && !errors.Is(err, logstore.ErrClosed) {
				report("read", err)
			}
			if _, err := st.OffsetForTime(testBase); err != nil && !errors.Is(err, logstore.ErrClosed) {
				report("offset for time", err)
			}
		}
	}()
	go func() { // state writer
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			err := l.State().WriteState(map[string][]byte{"k": []byte(strconv.Itoa(i))}, nil)
			if err != nil && !errors.Is(err, logstore.ErrClosed) {
				report("write state", err)
			}
		}
	}()
	mustAppend(t, st, recs(1)...) // the others have had a commit's time to start
	if err := closeLog(); err != nil {
		t.Errorf("close: %v", err)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	deadline := time.After(Deadline)
	for {
		mu.Lock()
		n, d := sent, told
		mu.Unlock()
		if d == n {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("%d of %d appends were told", d, n)
		case <-time.After(time.Millisecond): // polls a count; the deadline alone fails
		}
	}
}
