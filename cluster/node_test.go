package cluster

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
)

// syncBuf collects a node's log; a failed test prints it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// site is n voters in one process over loopback: real Serf, real Raft TCP
// transports on ports the kernel picks, data in temporary directories.
type site struct {
	tb     testing.TB
	nodes  []*Node
	dirs   []string
	stores map[*Node]*logstore.Store

	// With servers set, each node gets a Server (replication and
	// commands) on loopback TCP, or on fnet when that is set.
	servers map[*Node]*Server
	fnet    *faultnet.Network
	reps    map[*Node]*Replicator

	// configure, when set, edits each node's Config before Open (keys,
	// certificates).
	configure func(id string, cfg *Config)
}

func startSite(tb testing.TB, n int) *site {
	tb.Helper()
	return startSiteOf(&site{tb: tb, stores: map[*Node]*logstore.Store{}}, n)
}

// startServingSite is startSite with a Server on every node, over fnet
// when it is not nil, else over loopback TCP.
func startServingSite(tb testing.TB, n int, fnet *faultnet.Network) *site {
	tb.Helper()
	return startSiteOf(&site{tb: tb, stores: map[*Node]*logstore.Store{}, servers: map[*Node]*Server{}, fnet: fnet}, n)
}

func startSiteOf(s *site, n int) *site {
	tb := s.tb
	tb.Helper()
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		dir := tb.TempDir()
		var join []string
		if i > 0 {
			join = []string{s.nodes[0].SerfAddr()}
		}
		s.dirs = append(s.dirs, dir)
		s.nodes = append(s.nodes, s.open(id, dir, "127.0.0.1:0", "127.0.0.1:0", join, n))
	}
	return s
}

func (s *site) open(id, dir, serfAddr, raftAddr string, join []string, expect int) *Node {
	return s.openVoter(id, dir, serfAddr, raftAddr, join, expect, true)
}

func (s *site) openVoter(id, dir, serfAddr, raftAddr string, join []string, expect int, voter bool) *Node {
	s.tb.Helper()
	logs := &syncBuf{}
	cfg := DefaultConfig()
	cfg.NodeID = id
	cfg.SerfAddr, cfg.RaftAddr = serfAddr, raftAddr
	cfg.Join = join
	cfg.BootstrapExpect = expect
	cfg.Voter = voter
	cfg.SnapshotDir = dir + "/snapshots"
	cfg.MQTTAddr = "127.0.0.1:1883"
	cfg.Version = "test"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	var ln net.Listener
	if s.servers != nil {
		var err error
		if s.fnet != nil {
			ln, err = s.fnet.Listen(id)
			cfg.Dial = s.fnet.Dialer(id)
			if err == nil {
				cfg.RaftListener, err = s.fnet.Listen(id + "/raft")
			}
		} else {
			ln, err = net.Listen("tcp", "127.0.0.1:0")
		}
		if err != nil {
			s.tb.Fatal(err)
		}
		cfg.ClusterAddr = ln.Addr().String()
	}
	if s.configure != nil {
		s.configure(id, &cfg)
	}
	st := s.openStore(dir + "/store")
	node, err := Open(cfg, st)
	if err != nil {
		s.tb.Fatalf("Open %s: %v", id, err)
	}
	s.stores[node] = st
	s.tb.Cleanup(func() {
		if err := node.Close(); err != nil {
			s.tb.Errorf("Close %s: %v", id, err)
		}
		if s.tb.Failed() {
			s.tb.Logf("log of %s:\n%s", id, logs)
		}
	})
	if ln != nil {
		srv := Serve(node.ClusterListener(ln), cfg.Logger)
		srv.ServeNode(node)
		s.servers[node] = srv
		s.tb.Cleanup(func() { _ = srv.Close() }) // before the node closes
	}
	return node
}

// openStore opens the node's store: with servers, a replica store
// (ManualCommit) holding stream "s" besides "default".
func (s *site) openStore(dir string) *logstore.Store {
	if s.servers == nil {
		return openStore(s.tb, dir)
	}
	st, err := logstore.Open(logstore.Config{
		Dir:               dir,
		Profile:           logstore.ProfilePiZero,
		Streams:           []logstore.StreamConfig{{Name: "s", Filters: []string{"s/#"}}, {Name: "default", Filters: []string{"#"}}},
		RetentionInterval: time.Hour,
		MinFreeBytes:      -1,
		ManualCommit:      true,
	})
	if err != nil {
		s.tb.Fatalf("logstore.Open: %v", err)
	}
	s.tb.Cleanup(func() { _ = st.Close() })
	return st
}

// eventually polls cond until it holds, failing after a generous deadline
// (a loaded 2-core machine runs these with -race).
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// controller waits until every node in live agrees on one controller,
// which is one of them and knows it, and returns it.
func (s *site) controller(live []*Node) *Node {
	s.tb.Helper()
	var ctl *Node
	eventually(s.tb, "the nodes agree on one controller", func() bool {
		ctl = nil
		id := live[0].Controller()
		for _, n := range live {
			if n.Controller() != id {
				return false
			}
			if n.ID() == id && n.IsController() {
				ctl = n
			}
		}
		return ctl != nil
	})
	return ctl
}

// kill stops a node as a crash would (no leave) and closes its store.
func (s *site) kill(n *Node) {
	s.tb.Helper()
	if r := s.reps[n]; r != nil {
		r.Close()
	}
	if srv := s.servers[n]; srv != nil {
		_ = srv.Close()
	}
	if err := n.Close(); err != nil {
		s.tb.Fatal(err)
	}
	if err := s.stores[n].Close(); err != nil {
		s.tb.Fatal(err)
	}
}

func without(nodes []*Node, gone *Node) []*Node {
	return slices.DeleteFunc(slices.Clone(nodes), func(n *Node) bool { return n == gone })
}

// registered waits until every node's state has every live node alive in
// its current epoch.
func (s *site) registered(live []*Node) {
	s.tb.Helper()
	eventually(s.tb, "every node's state registers every live node", func() bool {
		for _, n := range live {
			st, _ := n.State()
			for _, m := range live {
				b := st.Brokers[m.ID()]
				if b == nil || !b.Alive || b.Epoch != m.Epoch() {
					return false
				}
			}
		}
		return true
	})
}

func TestNode_ThreeVotersElectOneControllerAndReplaceIt(t *testing.T) {
	s := startSite(t, 3)
	ctl := s.controller(s.nodes)
	s.registered(s.nodes)

	// Every member carries its tags.
	for _, n := range s.nodes {
		ms := n.Members()
		if len(ms) != 3 {
			t.Fatalf("%s sees %d members, want 3", n.ID(), len(ms))
		}
		for _, m := range ms {
			if !m.Voter || m.RaftAddr == "" || m.MQTTAddr != "127.0.0.1:1883" || m.Version != "test" || m.Epoch == 0 {
				t.Fatalf("%s sees member %+v", n.ID(), m)
			}
		}
	}

	// A stream led by the controller, created through it.
	replicas := []string{ctl.ID()}
	for _, n := range s.nodes {
		if n != ctl {
			replicas = append(replicas, n.ID())
		}
	}
	ctx := context.Background()
	if err := ctl.Apply(ctx, rules.CreateStream{Name: "telemetry", Replicas: replicas}); err != nil {
		t.Fatal(err)
	}
	for _, n := range s.nodes {
		if n != ctl {
			if err := n.Apply(ctx, rules.ElectLeader{Name: "telemetry"}); err == nil {
				t.Fatalf("a follower (%s) applied a command", n.ID())
			}
		}
	}

	// The controller dies without leaving: a new one among the others, and
	// Serf's member-failed takes it out of the stream's ISR and leadership.
	s.kill(ctl)
	live := without(s.nodes, ctl)
	next := s.controller(live)
	if next == ctl {
		t.Fatal("the closed node is still the controller")
	}
	for _, n := range live {
		eventually(t, n.ID()+"'s state drops the dead controller from the stream", func() bool {
			st, _ := n.State()
			str := st.Streams["telemetry"]
			return !st.Brokers[ctl.ID()].Alive && str != nil && !str.InISR(ctl.ID()) &&
				str.Leader == replicas[1] && str.LeaderEpoch == 2
		})
	}
	if err := next.Apply(ctx, rules.ElectLeader{Name: "telemetry", Preferred: ctl.ID()}); err == nil {
		t.Fatal("the dead node was elected leader")
	}
}

func TestNode_MemberFailedLeavesTheISR(t *testing.T) {
	s := startSite(t, 3)
	ctl := s.controller(s.nodes)
	s.registered(s.nodes)
	var follower *Node
	for _, n := range s.nodes {
		if n != ctl {
			follower = n
			break
		}
	}
	ctx := context.Background()
	if err := ctl.Apply(ctx, rules.CreateStream{Name: "s", Replicas: []string{follower.ID(), ctl.ID()}}); err != nil {
		t.Fatal(err)
	}
	// The stream's leader is a node that is not the controller; it fails,
	// and the controller, still in office, hears it from Serf.
	s.kill(follower)
	live := without(s.nodes, follower)
	for _, n := range live {
		eventually(t, n.ID()+"'s state moves the stream to "+ctl.ID(), func() bool {
			st, _ := n.State()
			str := st.Streams["s"] // nil until this node applied the creation
			return str != nil && str.Leader == ctl.ID() && slices.Equal(str.ISR, []string{ctl.ID()}) && !st.Brokers[follower.ID()].Alive
		})
	}
	if got := s.controller(live); got != ctl {
		t.Fatalf("controller moved to %s; the test needs it to stay", got.ID())
	}

	// Restarted on its data and addresses (as a real node is, from its
	// config), with a new broker epoch, it is registered again but does
	// not return to the ISR on its old standing.
	i := slices.Index(s.nodes, follower)
	back := s.open(follower.ID(), s.dirs[i], follower.SerfAddr(), follower.RaftAddr(), []string{ctl.SerfAddr()}, 3)
	if back.Epoch() <= follower.Epoch() {
		t.Fatalf("restart epoch %d, not above %d", back.Epoch(), follower.Epoch())
	}
	live = append(live, back)
	s.registered(live)
	st, _ := ctl.State()
	if str := st.Streams["s"]; str.InISR(back.ID()) {
		t.Fatalf("restarted replica is in the ISR %v", str.ISR)
	}
	s.controller(live)
}

func TestNode_VotersAddedAndRemovedThroughSerf(t *testing.T) {
	// One voter bootstraps alone; the others join a running site (no
	// bootstrap of their own) and the controller adds them.
	s := &site{tb: t, stores: map[*Node]*logstore.Store{}}
	n1 := s.open("n1", t.TempDir(), "127.0.0.1:0", "127.0.0.1:0", nil, 1)
	join := []string{n1.SerfAddr()}
	n2 := s.open("n2", t.TempDir(), "127.0.0.1:0", "127.0.0.1:0", join, 0)
	n3 := s.open("n3", t.TempDir(), "127.0.0.1:0", "127.0.0.1:0", join, 0)
	b4 := s.openVoter("b4", t.TempDir(), "127.0.0.1:0", "127.0.0.1:0", join, 0, false)
	all := []*Node{n1, n2, n3, b4}
	quorum := func(n *Node, voters, nonvoters []string) func() bool {
		return func() bool {
			v, nv, err := n.Quorum()
			return err == nil && slices.Equal(v, voters) && slices.Equal(nv, nonvoters)
		}
	}
	for _, n := range all {
		eventually(t, n.ID()+" sees voters n1-n3 and non-voter b4", quorum(n, []string{"n1", "n2", "n3"}, []string{"b4"}))
	}
	s.registered(all)
	if ctl := s.controller(all); ctl == b4 {
		t.Fatal("a non-voter became controller")
	}

	// A voter that leaves gracefully leaves the quorum; the controller
	// stays with two voters.
	if err := n3.Leave(); err != nil {
		t.Fatal(err)
	}
	live := []*Node{n1, n2, b4}
	for _, n := range live {
		eventually(t, n.ID()+" sees n3 gone from the quorum", quorum(n, []string{"n1", "n2"}, []string{"b4"}))
		eventually(t, n.ID()+" sees n3 dead in the state", func() bool {
			st, _ := n.State()
			return !st.Brokers["n3"].Alive
		})
	}
	s.controller(live)
}
