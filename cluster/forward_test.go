package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// fwdSite starts three nodes (startLogSite, o.Voters aside) and creates
// stream "s" with a follower (not the controller) as its leader: leader,
// then the controller and the other follower as replicas. It returns the
// leader and the two others.
func fwdSite(t *testing.T, o siteOpts) (leader *testNode, others []*testNode, kill func(*testNode)) {
	t.Helper()
	o.Voters = 3
	nodes, kill := startLogSite(t, o)
	ctl, rest := roles(t, nodes)
	leader, others = rest[0], []*testNode{ctl, rest[1]}
	replicas := []string{leader.Node.ID(), ctl.Node.ID(), rest[1].Node.ID()}
	for _, ln := range nodes {
		createStreams(t, ln, replicas, "s")
	}
	// The followers forward once their copy of the state names the leader
	// at an address.
	for _, ln := range others {
		eventually(t, ln.Node.ID()+" knows the leader", func() bool {
			id, _, addr := ln.Log.Stream("s").(*stream).stateLeader()
			return id == leader.Node.ID() && addr != ""
		})
	}
	return leader, others, kill
}

// asyncAppends appends n batches of one record each to s without waiting,
// and returns a func that waits for every done and gives the results in
// call order.
type fwdResult struct {
	topic string
	first uint64
	err   error
}

func asyncAppends(s mqtt.Stream, prefix string, n int) func(t *testing.T) []fwdResult {
	res := make([]fwdResult, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var order []int // the order done calls came in
	for i := range n {
		wg.Add(1)
		topic := fmt.Sprintf("s/%s/%d", prefix, i)
		res[i].topic = topic
		s.AppendAsync([]*logstore.Record{{Topic: topic, QoS: 1, Payload: []byte(prefix)}}, func(first uint64, err error) {
			mu.Lock()
			res[i].first, res[i].err = first, err
			order = append(order, i)
			mu.Unlock()
			wg.Done()
		})
	}
	return func(t *testing.T) []fwdResult {
		t.Helper()
		ch := make(chan struct{})
		go func() { wg.Wait(); close(ch) }()
		select {
		case <-ch:
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: not every done was called", prefix)
		}
		for i, j := range order {
			if i != j {
				t.Fatalf("%s: done %d called as the %dth: not in call order", prefix, j, i)
			}
		}
		return res
	}
}

// TestLog_ForwardAppend: an append on a follower is forwarded to the
// leader, done gets the leader's offset once it is committed there (and
// readable here), every replica holds it at that offset, and many
// appends from two followers at once keep each follower's call order.
// No fault is made here: the session timeout is long so that a Raft
// stall of the loaded test machine (a controller that missed its lease
// for 500 ms, then an election) does not make the leader count itself
// cut off and refuse, as it rightly does after 2.25 s without contact
// under the default 3 s (seen twice in make test on 2026-12-07).
func TestLog_ForwardAppend(t *testing.T) {
	leader, others, _ := fwdSite(t, siteOpts{MinISR: 2, SessionTimeout: 10 * time.Second})
	f1, f2 := others[0].Log.Route("s/x"), others[1].Log.Route("s/x")
	first, err := logAppend(t, f1, logRecs(3, "one")...)
	if err != nil || first != 0 {
		t.Fatalf("append on follower %s: first %d err %v, want 0 nil", others[0].Node.ID(), first, err)
	}
	if c := f1.Committed(); c < 3 {
		t.Fatalf("done called with the follower's Committed at %d, want at least 3", c)
	}
	if first, err = logAppend(t, f2, logRecs(2, "two")...); err != nil || first != 3 {
		t.Fatalf("append on follower %s: first %d err %v, want 3 nil", others[1].Node.ID(), first, err)
	}
	// The leader's refusal comes back as the error its own producer gets.
	big := &logstore.Record{Topic: "s/big", QoS: 1, Payload: make([]byte, leader.store.MaxRecordBytes()+1)}
	if _, err := logAppend(t, f1, big); !errors.Is(err, logstore.ErrRecordTooLarge) {
		t.Fatalf("a record too large through a follower: %v, want ErrRecordTooLarge", err)
	}

	const n = 300
	wait1, wait2 := asyncAppends(f1, "a", n), asyncAppends(f2, "b", n)
	r1, r2 := wait1(t), wait2(t)
	for _, r := range append(r1, r2...) {
		if r.err != nil {
			t.Fatalf("%s: %v", r.topic, r.err)
		}
	}
	total := uint64(5 + 2*n)
	ls := leader.Log.Route("s/x")
	want := committedRecs(t, leader.Node.ID(), ls, total)
	for _, rs := range [][]fwdResult{r1, r2} {
		last := uint64(0)
		for i, r := range rs {
			if r.err != nil {
				t.Fatalf("%s: %v", r.topic, r.err)
			}
			if i > 0 && r.first <= last {
				t.Fatalf("%s at %d, after %d: one follower's appends out of order", r.topic, r.first, last)
			}
			last = r.first
			if got := want[r.first].Topic; got != r.topic {
				t.Fatalf("done gave %s offset %d, which holds %s on the leader", r.topic, r.first, got)
			}
		}
	}
	for _, ln := range others {
		got := committedRecs(t, ln.Node.ID(), ln.Log.Route("s/x"), total)
		for i := range want {
			if got[i].Topic != want[i].Topic || got[i].Offset != uint64(i) {
				t.Fatalf("%s offset %d holds %s, the leader %s", ln.Node.ID(), i, got[i].Topic, want[i].Topic)
			}
		}
	}
}

// TestLog_ForwardLeaderKilled: a follower forwards appends while the
// leader is killed. No append is reported done unless every surviving
// replica holds it, exactly once, at the offset done gave; the others are
// refused with ErrLeaderUnavailable (or ErrNotEnoughReplicas), and the
// follower's appends succeed again under the new leader.
func TestLog_ForwardLeaderKilled(t *testing.T) {
	leader, others, kill := fwdSite(t, siteOpts{MinISR: 2})
	f := others[1].Log.Route("s/x")
	var waits []func(*testing.T) []fwdResult
	killed := make(chan struct{})
	for round := 0; ; round++ {
		n := 25
		if round == 1 {
			n = 300 // in flight when the leader dies
		}
		waits = append(waits, asyncAppends(f, fmt.Sprintf("r%d", round), n))
		switch {
		case round == 0:
			waits[0](t)
		case round == 1:
			go func() {
				// Its connections drop first, as in a crash, while its
				// store still holds records not yet committed.
				_ = leader.Server.Close()
				kill(leader)
				close(killed)
			}()
		default:
			waits[round](t) // one round at a time until the kill is over
		}
		if round > 0 {
			select {
			case <-killed:
			default:
				continue
			}
			break
		}
	}
	acked := map[string]uint64{}
	refused := 0
	for _, w := range waits {
		for _, r := range w(t) {
			switch {
			case r.err == nil:
				acked[r.topic] = r.first
			case errors.Is(r.err, mqtt.ErrLeaderUnavailable), errors.Is(r.err, mqtt.ErrNotEnoughReplicas):
				refused++
			default:
				t.Fatalf("%s refused with %v", r.topic, r.err)
			}
		}
	}
	kill(leader)
	// Publishing resumes through the new leader.
	eventually(t, "the follower's appends succeed under the new leader", func() bool {
		first, err := logAppend(t, f, &logstore.Record{Topic: "s/after", QoS: 1})
		if err == nil {
			acked["s/after"] = first
		}
		return err == nil
	})
	t.Logf("%d acknowledged, %d refused", len(acked), refused)
	var end uint64
	for _, off := range acked {
		end = max(end, off+1)
	}
	var ref []*logstore.Record
	for _, ln := range others {
		got := committedRecs(t, ln.Node.ID(), ln.Log.Route("s/x"), end)
		seen := map[string]int{}
		for _, r := range got {
			seen[r.Topic]++
		}
		for topic, off := range acked {
			if seen[topic] != 1 || got[off].Topic != topic {
				t.Fatalf("%s: acknowledged %s at %d: held %d times, offset %d holds %s", ln.Node.ID(), topic, off, seen[topic], off, got[off].Topic)
			}
		}
		if ref == nil {
			ref = got
			continue
		}
		for i := range min(len(ref), len(got)) {
			if ref[i].Topic != got[i].Topic {
				t.Fatalf("offset %d: %s on one replica, %s on the other", i, ref[i].Topic, got[i].Topic)
			}
		}
	}
}

// TestLog_AcksLeader: with acks=leader, the leader answers appends, its
// own and forwarded ones, while the ISR is below min_insync_replicas
// (acks=all refuses them then), and state writes too.
func TestLog_AcksLeader(t *testing.T) {
	var acksLeader sync.Map // stream -> bool, flipped by the test
	flipped := func(s string) bool { v, _ := acksLeader.Load(s); return v == true }
	leader, others, kill := fwdSite(t, siteOpts{MinISR: 3, AcksLeaderFor: flipped})
	ls, f := leader.Log.Route("s/x"), others[0].Log.Route("s/x")
	if _, err := logAppend(t, f, logRecs(2, "all")...); err != nil {
		t.Fatalf("acks=all with the full ISR: %v", err)
	}
	kill(others[1])
	eventually(t, "the ISR loses the dead follower", func() bool {
		st, _ := leader.Node.State()
		return len(st.Streams["s"].ISR) == 2
	})
	eventually(t, "acks=all refuses below min_insync_replicas", func() bool {
		_, err := logAppend(t, ls, logRecs(1, "refused")...)
		return errors.Is(err, mqtt.ErrNotEnoughReplicas)
	})
	acksLeader.Store("s", true)
	first, err := logAppend(t, ls, logRecs(1, "leader")...)
	if err != nil {
		t.Fatalf("acks=leader on the leader below min_insync_replicas: %v", err)
	}
	if c := ls.Committed(); c > first {
		t.Fatalf("Committed %d: the record was committed, which this test needs it not to be", c)
	}
	if _, err := logAppend(t, f, logRecs(1, "fwd")...); err != nil {
		t.Fatalf("acks=leader forwarded below min_insync_replicas: %v", err)
	}
	if err := f.WriteState(map[string][]byte{"g/x": {1}}, nil); err != nil {
		t.Fatalf("acks=leader state write below min_insync_replicas: %v", err)
	}
}

func offsetVal(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func loadKey(t *testing.T, s mqtt.Stream, key string) []byte {
	t.Helper()
	var got []byte
	if err := s.LoadState(key, func(k string, v []byte) error {
		if k == key {
			got = append([]byte{}, v...)
		}
		return nil
	}); err != nil {
		t.Fatalf("LoadState: %v", err)
	}
	return got
}

// TestLog_StateFailover: a group offset written through a follower, and
// one written on the leader, are in the new leader's state after the
// leader is killed (WriteState answers once the ISR holds it), a deleted
// key stays deleted, and the new leader's StateMoved fires.
func TestLog_StateFailover(t *testing.T) {
	leader, others, kill := fwdSite(t, siteOpts{MinISR: 2})
	next, f := others[0].Log.Route("s/x"), others[1].Log.Route("s/x")
	if _, err := logAppend(t, f, logRecs(10, "r")...); err != nil {
		t.Fatal(err)
	}
	if err := leader.Log.Route("s/x").WriteState(map[string][]byte{"g/lead": offsetVal(4), "g/gone": offsetVal(1)}, nil); err != nil {
		t.Fatalf("WriteState on the leader: %v", err)
	}
	if err := f.WriteState(map[string][]byte{"g/grp": offsetVal(7)}, []string{"g/gone"}); err != nil {
		t.Fatalf("WriteState through follower %s: %v", others[1].Node.ID(), err)
	}
	moved := next.StateMoved()
	kill(leader)
	select {
	case <-moved:
	case <-time.After(time.Minute):
		t.Fatal("StateMoved did not fire on the new leader")
	}
	eventually(t, others[0].Node.ID()+" leads", func() bool { return next.(*stream).leading() != nil })
	if got := loadKey(t, next, "g/grp"); string(got) != string(offsetVal(7)) {
		t.Fatalf("the new leader's g/grp = %x, want %x", got, offsetVal(7))
	}
	if got := loadKey(t, next, "g/lead"); string(got) != string(offsetVal(4)) {
		t.Fatalf("the new leader's g/lead = %x, want %x", got, offsetVal(4))
	}
	if got := loadKey(t, next, "g/gone"); got != nil {
		t.Fatalf("the new leader still has the deleted g/gone = %x", got)
	}
	// The remaining follower writes through the new leader, which
	// replicates to it (refused until its copy of the state names it).
	eventually(t, "a state write through the new leader", func() bool {
		err := f.WriteState(map[string][]byte{"g/grp": offsetVal(9)}, nil)
		if err != nil && !errors.Is(err, mqtt.ErrLeaderUnavailable) {
			t.Fatalf("WriteState through the new leader: %v", err)
		}
		return err == nil
	})
	if got := loadKey(t, next, "g/grp"); string(got) != string(offsetVal(9)) {
		t.Fatalf("the new leader's g/grp = %x, want %x", got, offsetVal(9))
	}
	eventually(t, "the follower holds the new leader's state", func() bool {
		return string(loadKey(t, f, "g/grp")) == string(offsetVal(9))
	})
}

// TestLog_ClaimAcrossNodes: claims from any node are decided by the
// leader: of two clients on two followers only one holds a key, an
// Unclaim through a follower frees it, and a claim held by a client of a
// node that dies is released once the site has it failed.
func TestLog_ClaimAcrossNodes(t *testing.T) {
	leader, others, kill := fwdSite(t, siteOpts{MinISR: 2})
	a, b := others[0].Log.Route("s/x"), others[1].Log.Route("s/x")
	type res struct {
		ok  bool
		cur string
	}
	var ra, rb res
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); ra.ok, ra.cur = a.Claim("g/x", "ca") }()
	go func() { defer wg.Done(); rb.ok, rb.cur = b.Claim("g/x", "cb") }()
	wg.Wait()
	if ra.ok == rb.ok {
		t.Fatalf("claims from two nodes: %v and %v, want exactly one granted", ra, rb)
	}
	winner, loser, lname, wname := a, b, "cb", "ca"
	if rb.ok {
		winner, loser, lname, wname = b, a, "ca", "cb"
		if ra.cur != "cb" {
			t.Fatalf("refused claim names %q, want cb", ra.cur)
		}
	} else if rb.cur != "ca" {
		t.Fatalf("refused claim names %q, want ca", rb.cur)
	}
	if ok, cur := leader.Log.Route("s/x").Claim("g/x", "cl"); ok || cur != wname {
		t.Fatalf("claim on the leader = %v %q, want refused naming %s", ok, cur, wname)
	}
	winner.Unclaim("g/x", wname)
	if ok, _ := loser.Claim("g/x", lname); !ok {
		t.Fatal("claim refused after the holder unclaimed it")
	}
	// The holder's node dies: its claim goes once the state has it failed.
	holder := others[0]
	if loser != a {
		holder = others[1]
	}
	other := others[0]
	if holder == others[0] {
		other = others[1]
	}
	kill(holder)
	eventually(t, "the dead node's claim is released", func() bool {
		ok, _ := other.Log.Route("s/x").Claim("g/x", "c3")
		return ok
	})
}

// TestLog_ForwardStopsEverything: a site whose followers forwarded
// appends, state writes and claims and followed the leader's state
// leaves none of the Log's goroutines behind once closed. (It looks for
// them by name: raft's NetworkTransport keeps the goroutine of an
// accepted connection until its peer's pooled connection closes, which
// a three-node site's shutdown does not wait for.)
func TestLog_ForwardStopsEverything(t *testing.T) {
	noLeakOf(t, []string{"cluster.(*forwarder)", "cluster.(*stream)", "cluster.(*Server)", "cluster.(*Log)", "cluster.(*rpcConn)"}, func(t *testing.T) {
		t.Run("site", func(t *testing.T) {
			_, others, _ := fwdSite(t, siteOpts{MinISR: 2})
			f := others[0].Log.Route("s/x")
			if _, err := logAppend(t, f, logRecs(2, "x")...); err != nil {
				t.Fatal(err)
			}
			if err := f.WriteState(map[string][]byte{"g/x": offsetVal(1)}, nil); err != nil {
				t.Fatal(err)
			}
			if ok, _ := f.Claim("g/x", "c"); !ok {
				t.Fatal("claim refused")
			}
		})
	})
}

// noLeakOf runs fn, which must stop everything it starts, and fails if a
// goroutine whose stack names one of funcs is still running after it.
func noLeakOf(t *testing.T, funcs []string, fn func(t *testing.T)) {
	t.Helper()
	fn(t)
	deadline := time.Now().Add(20 * time.Second)
	for {
		buf := make([]byte, 4<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		var left []string
		for _, g := range strings.Split(stacks, "\n\n") {
			for _, f := range funcs {
				if strings.Contains(g, f) {
					left = append(left, g)
					break
				}
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A leader's refusal in its own words reaches the follower's producer as
// the same reason; an error's text does not become a reason.
func TestProduceErr_KeepsTheLeadersReason(t *testing.T) {
	reason := errCutOff.(*mqtt.Refusal).Reason
	err := produceErr("s", &wire.ProduceResponse{Code: produceCode(errCutOff), Message: reason})
	rf, ok := errors.AsType[*mqtt.Refusal](err)
	if !ok || rf.Reason != reason || !errors.Is(err, mqtt.ErrLeaderUnavailable) {
		t.Fatalf("produceErr = %v; want a refusal with the leader's reason, of ErrLeaderUnavailable", err)
	}
	err = produceErr("s", &wire.ProduceResponse{Code: wire.NotLeader, Message: "cluster: append to s: leadership ending: mqtt: stream leader unavailable"})
	if _, ok := errors.AsType[*mqtt.Refusal](err); ok || !errors.Is(err, mqtt.ErrLeaderUnavailable) {
		t.Fatalf("produceErr = %v; want ErrLeaderUnavailable without a reason of its own", err)
	}
}
