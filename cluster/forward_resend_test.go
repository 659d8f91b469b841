package cluster

import (
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/cluster/wire"
)

// resendTimeout is the ForwardTimeout of these tests: past what a commit
// takes while the follower's own fetches stall (the leader drops it from
// the ISR after LagMax, or its fetcher dials again), so that an append
// refused shows a missing resend rather than a slow commit.
const resendTimeout = 6 * time.Second

// resendStall is how long these tests stall the connections open between
// a follower and the leader: past resendTimeout, so that an append that
// waits for the old connection is refused.
const resendStall = resendTimeout + 3*time.Second

// stalledAppends makes n appends through follower fl, right after the
// connections from -> to (fl and the leader, one way) stall, and returns
// their results: all answered before the stall ends, or t fails.
func stalledAppends(t *testing.T, fnet *faultnet.Network, fl *testNode, from, to string, prefix string, n int) []timedResult {
	t.Helper()
	f := fl.Log.Route("s/x")
	if _, err := logAppend(t, f, logRecs(2, "warm")...); err != nil {
		t.Fatalf("append before the stall: %v", err)
	}
	fnet.Stall(from, to, resendStall)
	_, wait := timedAppends(f, prefix, n)
	res, ok := wait(resendStall)
	if !ok {
		t.Fatalf("appends through %s not answered within %v of the stall", fl.Node.ID(), resendStall)
	}
	return res
}

// ackedOnce fails t unless every append of res was acknowledged, in call
// order, and the leader holds each once, at the offset it was
// acknowledged at.
func ackedOnce(t *testing.T, leader *testNode, res []timedResult) {
	t.Helper()
	var last uint64
	var slowest time.Duration
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("%s: refused after %v: %v", r.topic, r.after, r.err)
		}
		if i > 0 && r.first <= last {
			t.Fatalf("%s at %d after %d: out of call order", r.topic, r.first, last)
		}
		last, slowest = r.first, max(slowest, r.after)
	}
	t.Logf("%d appends acknowledged within %v", len(res), slowest)
	recs := committedRecs(t, leader.Node.ID(), leader.Log.Route("s/x"), last+1)
	for _, r := range res {
		held(t, leader.Node.ID(), recs, r.topic, r.first)
	}
}

// TestLog_ForwardResentOnANewConnection: the forward connection stalls
// (what it sends is held, as by TCP's retransmission backoff after a
// cut) while a new one would connect. The appends sent on it are sent
// again on a new connection and acknowledged long before the forward
// timeout, each stored once, in call order; the first copies, delivered
// when the stall ends, are not stored again.
func TestLog_ForwardResentOnANewConnection(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{MinISR: 2, Net: fnet, ForwardTimeout: resendTimeout})
	fl := others[1] // not the controller
	start := time.Now()
	res := stalledAppends(t, fnet, fl, fl.Node.ID(), leader.Node.ID(), "req", 20)
	ackedOnce(t, leader, res)

	// The first copies reach the leader when the stall ends, on the
	// connection the forwarder gave up: the leader knows them.
	time.Sleep(time.Until(start.Add(resendStall + time.Second)))
	if _, err := logAppend(t, fl.Log.Route("s/x"), logRecs(1, "after")...); err != nil {
		t.Fatalf("append after the stall: %v", err)
	}
	ackedOnce(t, leader, res)
}

// TestLog_ForwardAnsweredAsItsFirstCopy: the leader's answers on the
// forward connection stall; the appends, stored already, are sent again
// on a new connection and the leader answers each with the offset it
// stored its first copy at, rather than storing it twice.
func TestLog_ForwardAnsweredAsItsFirstCopy(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{MinISR: 2, Net: fnet, ForwardTimeout: resendTimeout})
	fl := others[1]
	res := stalledAppends(t, fnet, fl, leader.Node.ID(), fl.Node.ID(), "ans", 20)
	ackedOnce(t, leader, res)
}

// TestLog_ForwardNotResentToALeaderThatForgets: a leader that does not
// advertise remembering forwards (a node of an older version) is never
// sent an append again, which it would store twice: the appends whose
// answers stall are refused as of unknown fate at the forward timeout.
func TestLog_ForwardNotResentToALeaderThatForgets(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{MinISR: 2, Net: fnet, ForwardTimeout: resendTimeout, NoDedupTag: true})
	fl := others[1]
	res := stalledAppends(t, fnet, fl, leader.Node.ID(), fl.Node.ID(), "old", 5)
	for _, r := range res {
		if r.err == nil {
			t.Fatalf("%s: acknowledged after %v through a connection whose answers stall: sent again to a leader that does not advertise remembering forwards", r.topic, r.after)
		}
		if r.after < resendTimeout {
			t.Fatalf("%s: refused after %v, before the forward timeout %v: %v", r.topic, r.after, resendTimeout, r.err)
		}
	}
}

// fwdProducers answers a forward seen before as its first copy, at once
// or once that one is answered, and never sends it twice.
func TestFwdProducers_AnswersAForwardSeenBeforeAsItsFirstCopy(t *testing.T) {
	tbl := fwdProducers{keep: fwdSeenFor}
	var sent []uint64
	var finishes []func(*wire.ProduceResponse)
	send := func(seq uint64) func(func(*wire.ProduceResponse)) {
		return func(finish func(*wire.ProduceResponse)) {
			sent = append(sent, seq)
			finishes = append(finishes, finish)
		}
	}
	var mu sync.Mutex
	got := map[string]*wire.ProduceResponse{}
	answer := func(name string) func(*wire.ProduceResponse) {
		return func(r *wire.ProduceResponse) { mu.Lock(); got[name] = r; mu.Unlock() }
	}
	const p = uint64(7) << 32
	tbl.handle("n2", p|1, answer("first"), send(p|1))
	tbl.handle("n2", p|1, answer("again, unanswered"), send(p|1))
	if len(sent) != 1 {
		t.Fatalf("a forward sent again before its first copy was answered was appended again (%d sends)", len(sent))
	}
	if got["again, unanswered"] != nil {
		t.Fatal("the copy sent again was answered before the first one")
	}
	finishes[0](&wire.ProduceResponse{Seq: p | 1, First: 41})
	for _, name := range []string{"first", "again, unanswered"} {
		if r := got[name]; r == nil || r.First != 41 {
			t.Fatalf("%s: answered %+v, want the first copy's offset 41", name, r)
		}
	}
	tbl.handle("n2", p|1, answer("again, answered"), send(p|1))
	if r := got["again, answered"]; len(sent) != 1 || r == nil || r.First != 41 {
		t.Fatalf("a forward sent again after its first copy was answered: %d sends, answered %+v", len(sent), r)
	}
	// Another node's forward of the same Seq is another forward; so is
	// one of a node that predates producer ids (id 0), each time.
	tbl.handle("n3", p|1, answer("n3"), send(p|1))
	tbl.handle("n2", 1, answer("old"), send(1))
	tbl.handle("n2", 1, answer("old again"), send(1))
	if len(sent) != 4 {
		t.Fatalf("%d sends, want 4: another node's forward and the unnumbered ones are each appended", len(sent))
	}
	// Past fwdSeenMax answered forwards, the oldest are forgotten: one
	// of those sent again is refused, never appended.
	for i := range uint64(fwdSeenMax) {
		seq := p | (2 + i)
		tbl.handle("n2", seq, func(*wire.ProduceResponse) {}, send(seq))
		finishes[len(finishes)-1](&wire.ProduceResponse{Seq: seq, First: 100 + i})
	}
	n := len(sent)
	tbl.handle("n2", p|1, answer("forgotten"), send(p|1))
	if r := got["forgotten"]; len(sent) != n || r == nil || r.Code == wire.None || r.Message != fateForgotten {
		t.Fatalf("a forgotten forward sent again: appended %v, answered %+v; want refused as of unknown fate", len(sent) != n, r)
	}
}

// BenchmarkFwdProducers_Handle: what the leader's memory of forwards
// adds to each forwarded append (one producer, Seqs in order, each
// answered at once), against the append's own cost of tens of µs.
func BenchmarkFwdProducers_Handle(b *testing.B) {
	tbl := fwdProducers{keep: fwdSeenFor}
	resp := &wire.ProduceResponse{}
	answer := func(*wire.ProduceResponse) {}
	send := func(finish func(*wire.ProduceResponse)) { finish(resp) }
	const p = uint64(7) << 32
	b.ReportAllocs()
	for i := range b.N {
		tbl.handle("n2", p|uint64(i+1), answer, send)
	}
}
