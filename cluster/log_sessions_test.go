package cluster

import (
	"context"
	"testing"
	"time"
)

// sessionsSite is a three-node site serving the sessions' stream, led by
// the first node, every node a replica; kill stops a node.
func sessionsSite(t *testing.T) (nodes []*logNode, kill func(*logNode)) {
	t.Helper()
	nodes, kill = startLogSite(t, 3, 1)
	var ids []string
	for _, ln := range nodes {
		ids = append(ids, ln.node.ID())
		if _, err := ln.store.AddStream(sessionsStreamConfig()); err != nil {
			t.Fatalf("add the sessions' stream to %s: %v", ln.node.ID(), err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := nodes[0].node.Submit(ctx, CreateStream{Name: SessionsStream, Replicas: ids}); err != nil {
		t.Fatalf("create %s: %v", SessionsStream, err)
	}
	for _, ln := range nodes {
		eventually(t, ln.node.ID()+" serves "+SessionsStream+" with its leader known", func() bool {
			s := ln.log.stream(SessionsStream)
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
	nodes, _ := sessionsSite(t)
	leader, a, b := nodes[0], nodes[1], nodes[2]
	for _, ln := range nodes {
		if ln.log.Stream(SessionsStream) != nil || len(ln.log.Streams()) != 0 { // "s" is not created
			t.Fatalf("%s shows the sessions' stream to mqtt: %d streams", ln.node.ID(), len(ln.log.Streams()))
		}
	}
	taken := map[*logNode]chan string{}
	for _, ln := range nodes {
		ch := make(chan string, 4)
		taken[ln] = ch
		ln.log.OnSessionTaken(func(id string) { ch <- id })
	}
	if !a.log.ClaimSession("c1") {
		t.Fatal("the first claim was refused")
	}
	if err := a.log.SessionState().WriteState(map[string][]byte{"s/c1": []byte("v1")}, nil); err != nil {
		t.Fatalf("write the session: %v", err)
	}
	for _, ln := range nodes {
		eventually(t, ln.node.ID()+" has the session", func() bool {
			var got string
			_ = ln.log.SessionState().LoadState("s/c1", func(_ string, v []byte) error { got = string(v); return nil })
			return got == "v1"
		})
	}
	if !b.log.ClaimSession("c1") {
		t.Fatal("the claim on another node was refused")
	}
	select {
	case id := <-taken[a]:
		if id != "c1" {
			t.Fatalf("%s was told of %q, want c1", a.node.ID(), id)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s, which held the session, was not told it was taken", a.node.ID())
	}
	// The new holder claims again (a reconnect there): nobody is told.
	if !b.log.ClaimSession("c1") {
		t.Fatal("claiming again on the holder's node was refused")
	}
	// And back on the first node: the second is told, through the leader
	// deciding it this time as well as a follower's fetch.
	if !leader.log.ClaimSession("c1") {
		t.Fatal("the claim on the leader was refused")
	}
	select {
	case <-taken[b]:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s was not told its session was taken", b.node.ID())
	}
	for _, ln := range []*logNode{leader, a} {
		select {
		case id := <-taken[ln]:
			t.Fatalf("%s was told %q was taken, holding nothing", ln.node.ID(), id)
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
	nodes, kill := sessionsSite(t)
	leader, a, b := nodes[0], nodes[1], nodes[2]
	type offer struct {
		ln  *logNode
		ids []string
	}
	offers := make(chan offer, 100)
	taken := make(chan string, 4)
	for _, ln := range nodes {
		ln.log.OnSessionsOrphaned(func(ids []string) {
			select {
			case offers <- offer{ln, ids}:
			default:
			}
		})
	}
	leader.log.OnSessionTaken(func(id string) { taken <- id })
	if !a.log.ClaimSession("gone") || !b.log.ClaimSession("alive") {
		t.Fatal("a claim was refused")
	}
	kill(a)
	deadline := time.After(60 * time.Second)
	for adopted := false; !adopted; {
		select {
		case o := <-offers:
			if o.ln != leader {
				t.Fatalf("%s, which does not lead the sessions' stream, was offered %v", o.ln.node.ID(), o.ids)
			}
			for _, id := range o.ids {
				if id != "gone" {
					t.Fatalf("offered %q, whose node is alive", id)
				}
			}
			if b.log.AdoptSession(t.Context(), "gone") {
				t.Fatal("a node that does not lead the sessions' stream adopted a session")
			}
			if leader.log.AdoptSession(t.Context(), "alive") {
				t.Fatal("the leader adopted the session of a live node")
			}
			adopted = leader.log.AdoptSession(t.Context(), "gone")
		case <-deadline:
			t.Fatal("the session of the dead node was never adopted")
		}
	}
	if leader.log.AdoptSession(t.Context(), "gone") {
		t.Fatal("a session adopted already was adopted again")
	}
	if !b.log.ClaimSession("gone") {
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
