package logtest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// testRoute: the most specific filter wins, level by level from the left;
// no stream is a nil interface.
func testRoute(t *testing.T, s Suite) {
	l, _ := s.open(t, "all=#", "sensors=sensors/#", "power=sensors/+/power",
		"exact=sensors/1/power", "m=m/#", "no=+/n/o", "a=a", "dollar=$SYS/#")
	for _, tc := range []struct{ topic, want string }{
		{"sensors/1/power", "exact"},
		{"sensors/2/power", "power"},
		{"sensors/2/temp", "sensors"},
		{"sensors", "sensors"}, // "x/#" matches "x"
		{"other", "all"},
		{"m/n/o", "m"}, // a literal first level beats '+'
		{"q/n/o", "no"},
		{"a", "a"}, // a filter that ends with the topic beats "#"
		{"$SYS/x", "dollar"},
	} {
		got := l.Route(tc.topic)
		if got == nil || got.Name() != tc.want {
			t.Errorf("Route(%q) = %v, want %s", tc.topic, name(got), tc.want)
		}
	}

	l, _ = s.open(t, "a=sensors/#", "b=x/+")
	for _, topic := range []string{"other", "x", "x/y/z", "$SYS/x", ""} {
		if got := l.Route(topic); got != nil {
			t.Errorf("Route(%q) = %v, want a nil interface", topic, name(got))
		}
	}
	l, _ = s.open(t, "all=#", "plus=+/x")
	for _, topic := range []string{"$SYS", "$share/x", "$SYS/x", ""} {
		if got := l.Route(topic); got != nil {
			t.Errorf("Route(%q) = %v, want a nil interface: top-level wildcards match neither '$' topics nor the empty topic", topic, name(got))
		}
	}
}

func name(s mqtt.Stream) string {
	if s == nil {
		return "<nil>"
	}
	return s.Name()
}

// testStreams: every stream once, in configuration order, with its filters.
func testStreams(t *testing.T, s Suite) {
	l, _ := s.open(t, "b=b/#", "a=a/#,c/+/d", "z=z")
	ss := l.Streams()
	var names []string
	for _, st := range ss {
		names = append(names, st.Name())
	}
	if !slices.Equal(names, []string{"b", "a", "z"}) {
		t.Fatalf("Streams() = %v, want [b a z]", names)
	}
	if got := ss[1].Filters(); !slices.Equal(got, []string{"a/#", "c/+/d"}) {
		t.Fatalf("Filters() of a = %v, want [a/# c/+/d]", got)
	}
	ss[1].Filters()[0] = "changed/#" // the caller's copy
	if got := ss[1].Filters(); got[0] != "a/#" {
		t.Fatalf("changing the slice Filters() returned changed the stream's filters to %v", got)
	}
	if got := l.Route("a/x"); name(got) != "a" {
		t.Fatalf("Route(a/x) = %s after the caller changed a Filters() slice, want a", name(got))
	}
	for _, st := range ss {
		if got := l.Stream(st.Name()); got != st {
			t.Fatalf("Stream(%s) = %v, not the stream Streams lists", st.Name(), got)
		}
	}
	if got := l.Stream("nope"); got != nil {
		t.Fatalf("Stream(nope) = %#v, want a nil interface", got)
	}
	for _, st := range ss {
		if st.FirstOffset() != 0 || st.Committed() != 0 {
			t.Fatalf("new stream %s: FirstOffset %d Committed %d, want 0 0", st.Name(), st.FirstOffset(), st.Committed())
		}
	}
}

// testAppendOffsets: consecutive offsets from 0, set on the records;
// timestamps set when zero, kept otherwise; Committed above each append
// once its done ran.
func testAppendOffsets(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	var want []*logstore.Record
	before := time.Now().UnixMilli()
	for i, n := range []int{2, 3, 1} {
		batch := recs(n)
		for j, r := range batch {
			r.Topic = r.Topic + "/" + string(rune('a'+i))
			if j == 0 && i == 1 {
				r.Timestamp = 1234 // a producer's own time is kept
			}
		}
		first := mustAppend(t, st, batch...)
		if first != uint64(len(want)) {
			t.Fatalf("append %d: first %d, want %d", i, first, len(want))
		}
		for j, r := range batch {
			if r.Offset != first+uint64(j) {
				t.Fatalf("append %d record %d: Offset %d, want %d", i, j, r.Offset, first+uint64(j))
			}
		}
		want = append(want, batch...)
		if c := st.Committed(); c < uint64(len(want)) {
			t.Fatalf("after append %d: Committed %d, want %d", i, c, len(want))
		}
	}
	after := time.Now().UnixMilli()
	got := readAll(t, st, 0)
	checkOffsets(t, got, 0, want)
	for i, r := range got {
		switch {
		case i == 2 && r.Timestamp != 1234:
			t.Fatalf("record 2: Timestamp %d, want the producer's 1234", r.Timestamp)
		case i != 2 && (r.Timestamp < before || r.Timestamp > after):
			t.Fatalf("record %d: Timestamp %d, want the broker clock in [%d, %d]", i, r.Timestamp, before, after)
		}
	}
}

// testAppendDoneOrder: many appends in flight at once; each done is called
// once, in call order, with increasing offsets, and the records are
// committed when it runs.
func testAppendDoneOrder(t *testing.T, s Suite) {
	_, st, closeLog := s.stream(t)
	const n = 200
	var mu sync.Mutex
	type call struct {
		i         int
		first     uint64
		err       error
		committed uint64
	}
	var calls []call
	all := make(chan struct{})
	for i := range n {
		batch := recs(1 + i%3)
		st.AppendAsync(batch, func(first uint64, err error) {
			c := call{i: i, first: first, err: err, committed: st.Committed()}
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, c)
			if len(calls) == n {
				close(all)
			}
		})
	}
	select {
	case <-all:
	case <-time.After(Deadline):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d done calls within %v", len(calls), n, Deadline)
	}
	var next uint64
	for k, c := range calls {
		size := uint64(1 + c.i%3)
		switch {
		case c.i != k:
			t.Fatalf("done call %d was for append %d: not in call order", k, c.i)
		case c.err != nil:
			t.Fatalf("append %d: %v", c.i, c.err)
		case c.first != next:
			t.Fatalf("append %d: first %d, want %d", c.i, c.first, next)
		case c.committed < c.first+size:
			t.Fatalf("append %d: Committed %d when done ran, want at least %d", c.i, c.committed, c.first+size)
		}
		next += size
	}
	if err := closeLog(); err != nil {
		t.Fatalf("close: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != n {
		t.Fatalf("%d done calls for %d appends: one was called twice", len(calls), n)
	}
}

// testAppendRefused: a refused append takes no offset and leaves its
// neighbours alone, even in the same group commit.
func testAppendRefused(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	res := make(chan result, 3)
	done := func(first uint64, err error) { res <- result{first, err} }
	st.AppendAsync(recs(2), done)
	st.AppendAsync([]*logstore.Record{rec("bad", 100), nil}, done)
	st.AppendAsync(recs(1), done)
	var got []result
	for range 3 {
		select {
		case r := <-res:
			got = append(got, r)
		case <-time.After(Deadline):
			t.Fatalf("%d of 3 done calls within %v", len(got), Deadline)
		}
	}
	if got[0].err != nil || got[0].first != 0 {
		t.Fatalf("append before the refused one: first %d err %v, want 0 nil", got[0].first, got[0].err)
	}
	wantErr(t, "append with a nil record", got[1].err, logstore.ErrNilRecord)
	if got[2].err != nil || got[2].first != 2 {
		t.Fatalf("append after the refused one: first %d err %v, want 2 nil (no offset taken)", got[2].first, got[2].err)
	}
	if c := st.Committed(); c != 3 {
		t.Fatalf("Committed %d, want 3", c)
	}
	for _, r := range readAll(t, st, 0) {
		if r.Topic == "bad" {
			t.Fatalf("a record of the refused append was stored at %d", r.Offset)
		}
	}
}

// testAppendEmpty: an empty append succeeds at the log end and changes
// nothing.
func testAppendEmpty(t *testing.T, s Suite) {
	_, st, _ := s.stream(t)
	mustAppend(t, st, recs(2)...)
	if first := mustAppend(t, st); first != 2 {
		t.Fatalf("empty append: first %d, want the log end 2", first)
	}
	if first := mustAppend(t, st, recs(1)...); first != 2 {
		t.Fatalf("append after an empty one: first %d, want 2", first)
	}
}

// testAppendNoSpace: on a full disk an append is refused with an error
// wrapping logstore.ErrNoSpace (the broker answers MQTT 5 reason 0x97 on
// it), and nothing is stored.
func testAppendNoSpace(t *testing.T, s Suite) {
	l, closeLog := s.OpenFull(t, t.TempDir(), "default=#")
	t.Cleanup(func() { _ = closeLog() })
	st := only(t, l)
	for range 2 {
		r := appendWait(t, st, recs(2)...)
		wantErr(t, "append on a full disk", r.err, logstore.ErrNoSpace)
	}
	if c := st.Committed(); c != 0 {
		t.Fatalf("Committed %d after refused appends, want 0", c)
	}
	if got, err := st.Read(0, 10, 0); err != nil || len(got) != 0 {
		t.Fatalf("Read(0) after refused appends = %d records, %v; want none", len(got), err)
	}
}
