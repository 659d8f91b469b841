package cluster

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/cluster/wire"
)

// sessionsSite is a three-node site serving the sessions' stream, which
// the site creates on every node (a factor of 3 from 3 voters), with the
// cluster transport on fnet when it is not nil; nodes are its replicas
// in order, the first leading it; kill stops a node.
func sessionsSite(t *testing.T, fnet *faultnet.Network) (nodes []*testNode, kill func(*testNode)) {
	t.Helper()
	all, kill := startLogSite(t, siteOpts{MinISR: 1, Net: fnet})
	var ids []string
	eventually(t, "the site creates "+SessionsStream+" on every node", func() bool {
		st, _ := all[0].Node.State()
		if x := st.Streams[SessionsStream]; x != nil {
			ids = x.Replicas
		}
		return len(ids) == len(all)
	})
	for _, id := range ids {
		i := slices.IndexFunc(all, func(ln *testNode) bool { return ln.Node.ID() == id })
		nodes = append(nodes, all[i])
	}
	for _, ln := range nodes {
		eventually(t, ln.Node.ID()+" serves "+SessionsStream+" with its leader known", func() bool {
			s := ln.Log.stream(SessionsStream)
			if s == nil {
				return false
			}
			id, _, addr := s.stateLeader()
			return id == ids[0] && addr != "" && (ln != nodes[0] || s.leading() != nil)
		})
	}
	return nodes, kill
}

// A session's state written on one node is on every node, the stream is
// none of mqtt's, and a claim of the client id on another node takes the
// session from the node that held it, which is told.
func TestLog_SessionTakenOver(t *testing.T) {
	nodes, _ := sessionsSite(t, nil)
	leader, a, b := nodes[0], nodes[1], nodes[2]
	for _, ln := range nodes {
		if ln.Log.Stream(SessionsStream) != nil || len(ln.Log.Streams()) != 0 { // "s" is not created
			t.Fatalf("%s shows the sessions' stream to mqtt: %d streams", ln.Node.ID(), len(ln.Log.Streams()))
		}
	}
	taken := map[*testNode]chan string{}
	for _, ln := range nodes {
		ch := make(chan string, 4)
		taken[ln] = ch
		ln.Log.OnSessionTaken(func(id string) { ch <- id })
	}
	if !a.Log.ClaimSession("c1") {
		t.Fatal("the first claim was refused")
	}
	if err := a.Log.SessionState().WriteState(map[string][]byte{"s/c1": []byte("v1")}, nil); err != nil {
		t.Fatalf("write the session: %v", err)
	}
	for _, ln := range nodes {
		eventually(t, ln.Node.ID()+" has the session", func() bool {
			var got string
			_ = ln.Log.SessionState().LoadState("s/c1", func(_ string, v []byte) error { got = string(v); return nil })
			return got == "v1"
		})
	}
	if !b.Log.ClaimSession("c1") {
		t.Fatal("the claim on another node was refused")
	}
	select {
	case id := <-taken[a]:
		if id != "c1" {
			t.Fatalf("%s was told of %q, want c1", a.Node.ID(), id)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s, which held the session, was not told it was taken", a.Node.ID())
	}
	// The new holder claims again (a reconnect there): nobody is told.
	if !b.Log.ClaimSession("c1") {
		t.Fatal("claiming again on the holder's node was refused")
	}
	// And back on the first node: the second is told, through the leader
	// deciding it this time as well as a follower's fetch.
	if !leader.Log.ClaimSession("c1") {
		t.Fatal("the claim on the leader was refused")
	}
	select {
	case <-taken[b]:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s was not told its session was taken", b.Node.ID())
	}
	for _, ln := range []*testNode{leader, a} {
		select {
		case id := <-taken[ln]:
			t.Fatalf("%s was told %q was taken, holding nothing", ln.Node.ID(), id)
		default:
		}
	}
}

// The claim of a node that died is offered to the sessions' leader
// alone, which adopts it: the claim is then its own (a client claiming
// it elsewhere takes it from the leader, which is told), no longer
// offered, and adopting it again is refused. Claims of live nodes are
// never offered.
func TestLog_OrphanedSessionAdopted(t *testing.T) {
	nodes, kill := sessionsSite(t, nil)
	leader, a, b := nodes[0], nodes[1], nodes[2]
	type offer struct {
		ln  *testNode
		ids []string
	}
	offers := make(chan offer, 100)
	taken := make(chan string, 4)
	for _, ln := range nodes {
		ln.Log.OnSessionsOrphaned(func(ids []string) {
			select {
			case offers <- offer{ln, ids}:
			default:
			}
		})
	}
	leader.Log.OnSessionTaken(func(id string) { taken <- id })
	if !a.Log.ClaimSession("gone") || !b.Log.ClaimSession("alive") {
		t.Fatal("a claim was refused")
	}
	kill(a)
	deadline := time.After(60 * time.Second)
	for adopted := false; !adopted; {
		select {
		case o := <-offers:
			if o.ln != leader {
				t.Fatalf("%s, which does not lead the sessions' stream, was offered %v", o.ln.Node.ID(), o.ids)
			}
			for _, id := range o.ids {
				if id != "gone" {
					t.Fatalf("offered %q, whose node is alive", id)
				}
			}
			if b.Log.AdoptSession(t.Context(), "gone") {
				t.Fatal("a node that does not lead the sessions' stream adopted a session")
			}
			if leader.Log.AdoptSession(t.Context(), "alive") {
				t.Fatal("the leader adopted the session of a live node")
			}
			adopted = leader.Log.AdoptSession(t.Context(), "gone")
		case <-deadline:
			t.Fatal("the session of the dead node was never adopted")
		}
	}
	if leader.Log.AdoptSession(t.Context(), "gone") {
		t.Fatal("a session adopted already was adopted again")
	}
	if !b.Log.ClaimSession("gone") {
		t.Fatal("a client could not claim the adopted session")
	}
	select {
	case id := <-taken:
		if id != "gone" {
			t.Fatalf("the leader was told of %q, want gone", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the adopter was not told its session was taken")
	}
}

// writeSessions writes the sessions' state from ln, as mqtt's state
// writer does.
func writeSessions(t *testing.T, ln *testNode, puts map[string]string, dels ...string) {
	t.Helper()
	p := map[string][]byte{}
	for k, v := range puts {
		p[k] = []byte(v)
	}
	if err := ln.Log.SessionState().WriteState(p, dels); err != nil {
		t.Fatalf("%s: write sessions: %v", ln.Node.ID(), err)
	}
}

// storedSessions is ln's replica of the sessions' state.
func storedSessions(ln *testNode) map[string]string {
	got := map[string]string{}
	_ = ln.Log.SessionState().LoadState("", func(k string, v []byte) error {
		got[k] = string(v)
		return nil
	})
	return got
}

// waitSessions waits until every node's replica of the sessions' state
// is want.
func waitSessions(t *testing.T, nodes []*testNode, want map[string]string) {
	t.Helper()
	for _, ln := range nodes {
		eventually(t, ln.Node.ID()+" holds the sessions "+fmtKeys(want), func() bool {
			return maps.Equal(storedSessions(ln), want)
		})
	}
}

func fmtKeys(m map[string]string) string {
	var out string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out += " " + k + "=" + m[k]
	}
	return "{" + out + " }"
}

// A session's writes are fenced on the sessions' leader by its claim: a
// late write of the node that held it, sent after another node claimed
// it, is dropped, whether it puts or deletes, and the new holder's state
// stays; the rest of the same write (a session the node still holds) is
// written. The leader's own node, and a node writing a session no one
// claimed, are fenced alike. An older node's frame, which names no node,
// is written as before.
func TestLog_SessionWriteFencedOnLeader(t *testing.T) {
	nodes, _ := sessionsSite(t, nil)
	leader, a, b := nodes[0], nodes[1], nodes[2]
	if !a.Log.ClaimSession("c1") || !a.Log.ClaimSession("c2") {
		t.Fatal("a claim was refused")
	}
	writeSessions(t, a, map[string]string{"s/c1": "a1", "s/c2": "a2"})
	if !b.Log.ClaimSession("c1") {
		t.Fatal("the claim on another node was refused")
	}
	writeSessions(t, b, map[string]string{"s/c1": "b1"})

	writeSessions(t, a, map[string]string{"s/c1": "a-late", "s/c2": "a2-again"})
	writeSessions(t, a, nil, "s/c1")
	writeSessions(t, leader, map[string]string{"s/c1": "leader", "s/c2": "leader"})
	writeSessions(t, b, map[string]string{"s/c3": "nobody's"})
	want := map[string]string{"s/c1": "b1", "s/c2": "a2-again"}
	waitSessions(t, nodes, want)

	ls := leader.Log.stream(SessionsStream)
	ld := ls.leading()
	late := wire.StateWriteRequest{Stream: SessionsStream, LeaderEpoch: ld.epoch, Node: a.Node.ID(), BrokerEpoch: a.Node.Epoch(),
		Puts: []wire.KV{{Key: "s/c1", Val: []byte("x")}, {Key: "s/c2", Val: []byte("y")}}}
	if resp := ls.serveStateWrite(t.Context(), &late); resp.Code != wire.NotHolder || !slices.Equal(resp.Moved, []string{"s/c1"}) {
		t.Fatalf("a late write naming %s: %+v, want NotHolder moving s/c1 alone", a.Node.ID(), resp)
	}
	old := wire.StateWriteRequest{Stream: SessionsStream, LeaderEpoch: ld.epoch, Puts: []wire.KV{{Key: "s/c1", Val: []byte("old")}}}
	if resp := ls.serveStateWrite(t.Context(), &old); resp.Code != wire.None {
		t.Fatalf("an older node's write: %+v, want written", resp)
	}
	want["s/c1"] = "old"
	waitSessions(t, nodes, want)
}

// A session's offsets in a stream's own state are fenced by its claim on
// that stream's leader, as the session is on the sessions' leader: a late
// write of the node that lost the session, made on the stream's leader
// itself or forwarded to it, is dropped, whether it puts or deletes, and
// the new holder's offsets stay; a write of offsets no one claimed is
// dropped too, and a group's keys, which are no session's, are written.
// An older node's frame, which names no node, is written as before.
func TestLog_SessionOffsetsFencedOnStreamLeader(t *testing.T) {
	nodes, _ := sessionsSite(t, nil)
	leader, a, b := nodes[0], nodes[1], nodes[2]
	// a leads the stream and loses the session: its late write is fenced
	// where it is made; b's writes are forwarded to a.
	createStreams(t, a, []string{a.Node.ID(), b.Node.ID(), leader.Node.ID()}, "s")
	if !a.Log.ClaimSession("c1") || !a.Log.ClaimSession("c2") {
		t.Fatal("a claim was refused")
	}
	tap := "t/c1\x00s/#"
	writeStreamState(t, a, "s", map[string]string{"s/c1": "a1", "s/c2": "a2", tap: "a-tap"})
	if !b.Log.ClaimSession("c1") {
		t.Fatal("the claim on another node was refused")
	}
	writeStreamState(t, b, "s", map[string]string{"s/c1": "b1"})

	writeStreamState(t, a, "s", map[string]string{"s/c1": "a-late", "s/c2": "a2-again", "g/lake": "a-group"}, tap)
	writeStreamState(t, leader, "s", map[string]string{"s/c2": "not the leader's"})
	writeStreamState(t, b, "s", map[string]string{"s/c3": "nobody's"})
	want := map[string]string{"s/c1": "b1", "s/c2": "a2-again", tap: "a-tap", "g/lake": "a-group"}
	waitStreamState(t, nodes, "s", want)

	ls := a.Log.stream("s")
	old := wire.StateWriteRequest{Stream: "s", LeaderEpoch: ls.leading().epoch, Puts: []wire.KV{{Key: "s/c1", Val: []byte("old")}}}
	if resp := ls.serveStateWrite(t.Context(), &old); resp.Code != wire.None {
		t.Fatalf("an older node's write: %+v, want written", resp)
	}
	want["s/c1"] = "old"
	waitStreamState(t, nodes, "s", want)
}

// writeStreamState writes stream name's own state through ln.
func writeStreamState(t *testing.T, ln *testNode, name string, puts map[string]string, dels ...string) {
	t.Helper()
	p := map[string][]byte{}
	for k, v := range puts {
		p[k] = []byte(v)
	}
	if err := ln.Log.Stream(name).WriteState(p, dels); err != nil {
		t.Fatalf("%s: write the state of %s: %v", ln.Node.ID(), name, err)
	}
}

// waitStreamState waits until every node's replica of stream name's
// state is want.
func waitStreamState(t *testing.T, nodes []*testNode, name string, want map[string]string) {
	t.Helper()
	for _, ln := range nodes {
		eventually(t, ln.Node.ID()+" holds the state "+fmtKeys(want)+" of "+name, func() bool {
			got := map[string]string{}
			_ = ln.Log.Stream(name).LoadState("", func(k string, v []byte) error {
				got[k] = string(v)
				return nil
			})
			return maps.Equal(got, want)
		})
	}
}

// adoptNow has the sessions' leader ls adopt client id's session as
// AdoptSession does (the claim moves to it under claims.dec, and it holds
// it), without waiting for the site to see the holder's node fail: a
// partition from the leader alone leaves that node alive to Serf.
func adoptNow(t *testing.T, ls *stream, id string) {
	t.Helper()
	eventually(t, "the leader adopts "+id, func() bool {
		ls.claims.dec.Lock()
		defer ls.claims.dec.Unlock()
		cur, held, err := ls.claims.load(id)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
		defer cancel()
		me := claimHolder{holder: id, node: ls.l.node.ID(), epoch: ls.l.node.Epoch()}
		return ls.claims.put(ctx, ls.leading(), id, cur, held, me) == nil
	})
	ls.mu.Lock()
	ls.claims.mu.granted[id] = id
	ls.mu.Unlock()
}

// A node cut off from the sessions' leader holds a session; the leader
// adopts it (as it adopts the session of a node it sees fail, here
// wrongly), runs its expiry (deletes it) and lets the claim go. Once the
// link heals, the old holder's late write of the session does not bring
// it back, and the old holder learns it lost the session although its
// replica never saw the claim move, only go.
func TestLog_AdoptedSessionNotBroughtBack(t *testing.T) {
	fnet := faultnet.New()
	nodes, _ := sessionsSite(t, fnet)
	leader, a := nodes[0], nodes[1]
	if a.Node.Controller() == a.Node.ID() {
		a = nodes[2] // the leader must reach the controller to drop a from the ISR
	}
	taken := make(chan string, 4)
	a.Log.OnSessionTaken(func(id string) { taken <- id })
	if !a.Log.ClaimSession("p") {
		t.Fatal("the claim was refused")
	}
	writeSessions(t, a, map[string]string{"s/p": "connected"})
	isolate(fnet, a, leader)

	ls := leader.Log.stream(SessionsStream)
	adoptNow(t, ls, "p") // waits for the ISR to drop the cut-off node
	writeSessions(t, leader, nil, "s/p")
	leader.Log.ReleaseSession("p")
	eventually(t, "the adopter's release", func() bool {
		_, held, err := ls.claims.load("p")
		return err == nil && !held
	})

	fnet.Heal(a.Node.ID(), leader.Node.ID())
	eventually(t, "the old holder's late write answered", func() bool {
		return a.Log.SessionState().WriteState(map[string][]byte{"s/p": []byte("late")}, nil) == nil
	})
	if got := storedSessions(leader); len(got) != 0 {
		t.Fatalf("the expired session came back: %v", got)
	}
	select {
	case id := <-taken:
		if id != "p" {
			t.Fatalf("%s was told of %q, want p", a.Node.ID(), id)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s was never told it lost the session", a.Node.ID())
	}
	waitSessions(t, nodes, map[string]string{})
}

// A stored session that no claim holds (an older node's late write, or
// claims lost with an unclean election) is offered to the sessions'
// leader alone, which adopts it so that its expiry runs; a client id
// with nothing stored is not adopted.
func TestLog_UnclaimedSessionAdopted(t *testing.T) {
	nodes, _ := sessionsSite(t, nil)
	leader, b := nodes[0], nodes[2]
	offered := make(chan []string, 100)
	for _, ln := range nodes {
		ln.Log.OnSessionsOrphaned(func(ids []string) {
			if ln != leader {
				t.Errorf("%s, which does not lead the sessions' stream, was offered %v", ln.Node.ID(), ids)
			}
			select {
			case offered <- ids:
			default:
			}
		})
	}
	ls := leader.Log.stream(SessionsStream)
	old := wire.StateWriteRequest{Stream: SessionsStream, LeaderEpoch: ls.leading().epoch, Puts: []wire.KV{{Key: "s/u", Val: []byte("v")}}}
	if resp := ls.serveStateWrite(t.Context(), &old); resp.Code != wire.None {
		t.Fatalf("an older node's write: %+v", resp)
	}
	select {
	case ids := <-offered:
		if !slices.Equal(ids, []string{"u"}) {
			t.Fatalf("offered %v, want [u]", ids)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the unclaimed session was never offered")
	}
	if b.Log.AdoptSession(t.Context(), "u") {
		t.Fatal("a node that does not lead the sessions' stream adopted it")
	}
	if leader.Log.AdoptSession(t.Context(), "nothing-stored") {
		t.Fatal("a client id with no session and no claim was adopted")
	}
	if !leader.Log.AdoptSession(t.Context(), "u") {
		t.Fatal("the leader did not adopt the unclaimed session")
	}
	h, held, err := ls.claims.load("u")
	if err != nil || !held || h.node != leader.Node.ID() {
		t.Fatalf("claim after the adoption: %+v %v %v, want the leader's", h, held, err)
	}
}
