package cluster

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// fwdTestTimeout is the ForwardTimeout of these tests: short, so that
// they run in seconds, and long enough for a commit on a loaded machine.
const fwdTestTimeout = 2 * time.Second

// fwdWithin is how long a forwarded append the leader does not answer
// may take to be refused: the timeout and a generous margin, far below
// the 30 s a connection was held for before.
const fwdWithin = 3 * fwdTestTimeout

// timedResult is one append's outcome and how long after its call done ran.
type timedResult struct {
	fwdResult
	after time.Duration
}

// timedAppends appends n one-record batches to s without waiting. first
// is closed when the first done runs; wait gives every result, in call
// order, once all have run, or false after limit.
func timedAppends(s mqtt.Stream, prefix string, n int) (first <-chan struct{}, wait func(limit time.Duration) ([]timedResult, bool)) {
	res := make([]timedResult, n)
	var wg sync.WaitGroup
	var once sync.Once
	firstc := make(chan struct{})
	start := time.Now()
	for i := range n {
		wg.Add(1)
		topic := fmt.Sprintf("s/%s/%d", prefix, i)
		res[i].topic = topic
		s.AppendAsync([]*logstore.Record{{Topic: topic, QoS: 1, Payload: []byte(prefix)}}, func(first uint64, err error) {
			res[i].first, res[i].err, res[i].after = first, err, time.Since(start)
			once.Do(func() { close(firstc) })
			wg.Done()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return firstc, func(limit time.Duration) ([]timedResult, bool) {
		select {
		case <-done:
			return res, true
		case <-time.After(limit):
			return nil, false
		}
	}
}

// fateUnknown fails t unless err is the refusal of an append the leader
// did not answer in time: ErrLeaderUnavailable, with the reason string
// that tells the publisher its message may be stored and to publish again.
func fateUnknown(t *testing.T, r timedResult) {
	t.Helper()
	var rf *mqtt.Refusal
	if !errors.As(r.err, &rf) || !errors.Is(r.err, mqtt.ErrLeaderUnavailable) {
		t.Fatalf("%s: refused after %v with %v, want an mqtt.Refusal of ErrLeaderUnavailable", r.topic, r.after, r.err)
	}
	if rf.Reason != fateTimeout {
		t.Fatalf("%s: reason %q, want %q", r.topic, rf.Reason, fateTimeout)
	}
	if r.after > fwdWithin {
		t.Fatalf("%s: refused after %v, want within %v (ForwardTimeout %v)", r.topic, r.after, fwdWithin, fwdTestTimeout)
	}
}

// held fails t unless topic is at off among recs, and only there.
func held(t *testing.T, who string, recs []*logstore.Record, topic string, off uint64) {
	t.Helper()
	n := 0
	for _, r := range recs {
		if r.Topic == topic {
			n++
		}
	}
	if n != 1 || recs[off].Topic != topic {
		t.Fatalf("%s: %s acknowledged at %d: held %d times, offset %d holds %s", who, topic, off, n, off, recs[off].Topic)
	}
}

// TestLog_ForwardLeaderSilent: the leader goes silent for one follower
// (partitioned from it: packets held, no reset; both still reach the
// controller, so the leader keeps its leadership). The appends that
// follower forwarded are refused within about ForwardTimeout, as of
// unknown fate (the MQTT 5 reason says to publish again), not held for as
// long as the dead connection lasts; one made while still cut off is
// dialled for at once and refused as not stored. After the heal an append
// through the follower goes on a new connection, not behind the appends
// of the cut on the old one, and is acknowledged once, at the offset the
// leader holds it.
func TestLog_ForwardLeaderSilent(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{MinISR: 2, Net: fnet, ForwardTimeout: fwdTestTimeout})
	fl := others[1] // not the controller
	f := fl.Log.Route("s/x")
	if _, err := logAppend(t, f, logRecs(2, "warm")...); err != nil {
		t.Fatalf("append before the partition: %v", err)
	}

	before := fwdConnOf(f)
	if before == nil {
		t.Fatal("no forward connection after a forwarded append")
	}

	fnet.Partition(fl.Node.ID(), leader.Node.ID())
	_, wait := timedAppends(f, "cut", 20)
	// Not fatal: the heal below must come while a connection that is not
	// given up would still hold them, for the append after it to show
	// where it goes.
	res, answered := wait(fwdWithin)
	if !answered {
		t.Errorf("appends forwarded to a silent leader not answered within %v (ForwardTimeout %v)", fwdWithin, fwdTestTimeout)
	} else {
		var slowest time.Duration
		for _, r := range res {
			fateUnknown(t, r)
			slowest = max(slowest, r.after)
		}
		t.Logf("refused within %v (ForwardTimeout %v)", slowest, fwdTestTimeout)
		// Still cut off: the next append dials at once, and is refused
		// as not stored (it was never sent), not as of unknown fate.
		_, wait = timedAppends(f, "redial", 1)
		res, ok := wait(fwdWithin)
		if !ok {
			t.Fatalf("an append while the leader is unreachable not answered within %v", fwdWithin)
		}
		if r := res[0]; !errors.Is(r.err, mqtt.ErrLeaderUnavailable) || errors.As(r.err, new(*mqtt.Refusal)) {
			t.Fatalf("an append while the leader is unreachable: %v, want ErrLeaderUnavailable without a fate-unknown reason", r.err)
		}
	}

	fnet.Heal(fl.Node.ID(), leader.Node.ID())
	healed := time.Now()
	first, err := logAppend(t, f, &logstore.Record{Topic: "s/after", QoS: 1})
	if err != nil {
		t.Fatalf("append after the heal: %v", err)
	}
	t.Logf("the append after the heal answered in %v", time.Since(healed))
	if after := fwdConnOf(f); after == nil || after == before {
		t.Fatal("the append after the heal went on the connection of the appends made during the cut")
	}
	held(t, leader.Node.ID(), committedRecs(t, leader.Node.ID(), leader.Log.Route("s/x"), first+1), "s/after", first)
}

// fwdConnOf is the connection s forwards on now, nil if none.
func fwdConnOf(s mqtt.Stream) any {
	st := s.(*stream)
	st.fwd.mu.Lock()
	f := st.fwd.mu.cur
	st.fwd.mu.Unlock()
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.mu.conn; c != nil {
		return c
	}
	return nil
}

// TestLog_ForwardUnsentResent: when a connection is given up, the appends
// queued behind a full window and never sent are neither lost nor
// refused: they go, in call order, on the next connection, and are
// acknowledged once each. The leader here takes the appends but its
// answers do not come back (cut one way), so the window fills; the cut
// heals once the first refusal is seen, before the next connection's
// answers are due.
func TestLog_ForwardUnsentResent(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{MinISR: 2, Net: fnet, ForwardTimeout: fwdTestTimeout})
	fl := others[1]
	f := fl.Log.Route("s/x")
	if _, err := logAppend(t, f, logRecs(2, "warm")...); err != nil {
		t.Fatalf("append before the cut: %v", err)
	}

	const unsent = 50
	fnet.Cut(leader.Node.ID(), fl.Node.ID())
	first, wait := timedAppends(f, "q", fwdWindow+unsent)
	select {
	case <-first:
	case <-time.After(45 * time.Second):
		t.Fatal("no append was answered in 45 s")
	}
	fnet.Heal(leader.Node.ID(), fl.Node.ID())
	res, ok := wait(time.Minute)
	if !ok {
		t.Fatal("not every append was answered within a minute")
	}
	var last uint64
	for i, r := range res[fwdWindow:] {
		if r.err != nil {
			t.Fatalf("%s, queued and never sent on the first connection: %v", r.topic, r.err)
		}
		if i > 0 && r.first <= last {
			t.Fatalf("%s at %d after %d: out of call order", r.topic, r.first, last)
		}
		last = r.first
	}
	for _, r := range res[:fwdWindow] { // sent, then the connection was given up
		fateUnknown(t, r)
	}
	recs := committedRecs(t, leader.Node.ID(), leader.Log.Route("s/x"), last+1)
	for _, r := range res[fwdWindow:] {
		held(t, leader.Node.ID(), recs, r.topic, r.first)
	}
}
