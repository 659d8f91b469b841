package cluster

import (
	"bytes"
	"cmp"
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
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
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

// site is nodes in one process over loopback, each its bare parts as the
// test opens them: real Serf, real Raft TCP transports on ports the
// kernel picks, data in temporary directories; with Serve, a Server
// (replication and commands) on each; with replicate (replicator_test.go),
// a Replicator. Tests of Site and Log, which put the parts together, use
// newTestSite (testsite_test.go), which starts each node with StartSite;
// tests of the Log's rules through startLogSite (log_test.go).
type site struct {
	tb     testing.TB
	opts   partsOpts
	nodes  []*Node
	dirs   []string
	stores map[*Node]*logstore.Store

	servers map[*Node]*Server // with Serve
	reps    map[*Node]*Replicator
}

// partsOpts configure a site of bare parts (startSite); zero fields take
// the defaults.
type partsOpts struct {
	// Voters are opened as n1, n2... bootstrapping together, the others
	// joining n1; 0: none (the test opens its nodes).
	Voters int
	// Serve gives each node a Server on loopback TCP, or on Net when
	// that is set, and a replica store (openStore).
	Serve bool
	Net   *faultnet.Network
	// Configure, when set, edits each node's Config before Open (keys,
	// certificates).
	Configure func(id string, cfg *Config)
}

// nodeOpts are one node's part of its Config (site.open); zero fields
// take the defaults.
type nodeOpts struct {
	Dir        string // its data; "": a new temporary directory
	Serf, Raft string // addresses; "": a port the kernel picks
	Join       []string
	Expect     int  // BootstrapExpect
	Broker     bool // not a voter
}

// startSite opens o.Voters voters. Every node closes at cleanup.
func startSite(tb testing.TB, o partsOpts) *site {
	tb.Helper()
	s := &site{tb: tb, opts: o, stores: map[*Node]*logstore.Store{}}
	if o.Serve || o.Net != nil {
		s.servers = map[*Node]*Server{}
	}
	for i := range o.Voters {
		var join []string
		if i > 0 {
			join = []string{s.nodes[0].SerfAddr()}
		}
		dir := tb.TempDir()
		s.dirs = append(s.dirs, dir)
		s.nodes = append(s.nodes, s.open(fmt.Sprintf("n%d", i+1), nodeOpts{Dir: dir, Join: join, Expect: o.Voters}))
	}
	return s
}

// open opens node id.
func (s *site) open(id string, o nodeOpts) *Node {
	s.tb.Helper()
	logs := &syncBuf{}
	cfg := DefaultConfig()
	cfg.NodeID = id
	cfg.SerfAddr, cfg.RaftAddr = cmp.Or(o.Serf, "127.0.0.1:0"), cmp.Or(o.Raft, "127.0.0.1:0")
	cfg.Join = o.Join
	cfg.BootstrapExpect = o.Expect
	cfg.Voter = !o.Broker
	dir := o.Dir
	if dir == "" {
		dir = s.tb.TempDir()
	}
	cfg.SnapshotDir = dir + "/snapshots"
	cfg.MQTTAddr = "127.0.0.1:1883"
	cfg.Version = "test"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	var ln net.Listener
	if fnet := s.opts.Net; s.servers != nil {
		if fnet != nil {
			ln = onNet(s.tb, fnet, id, &cfg)
		} else {
			var err error
			if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				s.tb.Fatal(err)
			}
		}
		cfg.ClusterAddr = ln.Addr().String()
	}
	if s.opts.Configure != nil {
		s.opts.Configure(id, &cfg)
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

// eventually waits for a site of in-process nodes to reach a state
// (testwait.SiteLimit says why longer than other waits).
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	testwait.EventuallyWithin(tb, testwait.SiteLimit, what, cond)
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
	s := startSite(t, partsOpts{Voters: 3})
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
	s := startSite(t, partsOpts{Voters: 3})
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
	back := s.open(follower.ID(), nodeOpts{Dir: s.dirs[i], Serf: follower.SerfAddr(), Raft: follower.RaftAddr(), Join: []string{ctl.SerfAddr()}, Expect: 3})
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
	s := startSite(t, partsOpts{})
	n1 := s.open("n1", nodeOpts{Expect: 1})
	join := []string{n1.SerfAddr()}
	n2 := s.open("n2", nodeOpts{Join: join})
	n3 := s.open("n3", nodeOpts{Join: join})
	b4 := s.open("b4", nodeOpts{Join: join, Broker: true})
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
