package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/logstore"
)

// siteOpts configure a test site (newTestSite); zero fields take the
// defaults.
type siteOpts struct {
	// Voters bootstrap the site together (BootstrapExpect Voters); 0: 3.
	Voters int
	// IDs name the voters; nil: n1, n2...
	IDs []string
	// Streams are every node's configured streams; each node's store
	// holds them ("default" captures #, the others <name>/#). nil: one,
	// "default", of factor RF with AcksLeader; empty: none but the
	// site's sessions'.
	Streams    []SiteStream
	RF         int  // the default stream's replication factor; 0: the site's default
	AcksLeader bool // the default stream is acks: leader

	LeaderBalanceAfter time.Duration // SiteConfig's; 0: never
	ReplaceAfter       time.Duration // Config's; 0: never
	LagMax             time.Duration // SiteConfig's; 0: 2 s

	// Stored are streams of every node's store that its configuration
	// does not list, as "name=filter[,filter]": the test creates them
	// itself (createStreams), on replicas of its choosing.
	Stored         []string
	MinISR         int           // SiteConfig.MinInsyncReplicas
	MinFree        int64         // the stores' MinFreeBytes; 0: -1, no check
	SessionTimeout time.Duration // Config's; 0: the default
	// Dirs are the first nodes' data directories, in start order; a node
	// past its end gets a new temporary directory.
	Dirs []string
	// Net carries the cluster transport (forwarding, replica and state
	// fetch, commands, heartbeats) under the node's id and Raft under
	// id+"/raft"; Serf stays on loopback, so a cut never looks like a
	// failure to it. nil: loopback TCP.
	Net *faultnet.Network
	// AcksLeaderFor, when set, decides which streams are acks: leader
	// instead of Streams, asked at every append: a test may flip it.
	AcksLeaderFor  func(stream string) bool
	ForwardTimeout time.Duration // LogConfig's; 0: its default
	// ProbeAfter and ProbeWait: LogConfig's probeAfter and probeWait.
	ProbeAfter, ProbeWait time.Duration
	// NoDedupTag: the nodes do not advertise tagDedup, as nodes that
	// predate it (their forwarders then never send an append again).
	NoDedupTag   bool
	FetchMaxWait time.Duration // ReplicatorConfig's; 0: its default
	// StateFetchTimeout replaces DefaultFetchTimeout for state fetches.
	StateFetchTimeout time.Duration
	// BeforeLead runs on node before its Replicator starts a Leader for
	// stream; it may block (the Replicator waits).
	BeforeLead func(node, stream string)
	// Crash: a node still up at cleanup stops as crash stops it, with no
	// hand-over (which a test's cut links would hold for its timeout).
	Crash bool
}

// testSite is a site of in-process nodes, each a StartSite on its own
// store over loopback (real Serf, Raft and cluster transport; the last
// two on faultnet with siteOpts.Net), as `peat serve` runs one. A failed
// test prints every node's log.
type testSite struct {
	tb    testing.TB
	opts  siteOpts
	nodes []*testNode
	first *testNode // the node the others join
}

// testNode is one node of a test site. Its Site is replaced by restart.
type testNode struct {
	*Site
	id      string
	voter   bool
	expect  int
	join    []string     // Serf addresses a (re)start joins
	streams []SiteStream // the configuration's streams: edit before restart
	store   *logstore.Store
	logs    *syncBuf // this run's log

	site              *testSite
	dir               string // the store's and Raft's data, kept across restarts
	serf, raft, trans string // addresses, kept across restarts: "" picks a port
	down              bool
}

// newTestSite starts opts.Voters voters, the others joining the first.
// Every node stops at cleanup. A voter's restart joins every voter, as a
// real node's join lists the site.
func newTestSite(tb testing.TB, opts siteOpts) *testSite {
	tb.Helper()
	if opts.Voters == 0 {
		opts.Voters = max(3, len(opts.IDs))
	}
	for i := len(opts.IDs); i < opts.Voters; i++ {
		opts.IDs = append(opts.IDs, fmt.Sprintf("n%d", i+1))
	}
	if opts.Streams == nil {
		opts.Streams = []SiteStream{{Name: "default", ReplicationFactor: opts.RF, AcksLeader: opts.AcksLeader}}
	}
	if opts.LagMax == 0 {
		opts.LagMax = 2 * time.Second
	}
	s := &testSite{tb: tb, opts: opts}
	var joins []string
	for i, id := range opts.IDs[:opts.Voters] {
		n := s.start(id, true, opts.Voters)
		if i == 0 {
			s.first = n
		}
		joins = append(joins, n.serf)
	}
	for _, n := range s.nodes {
		if len(joins) > 1 { // a lone voter joins no one
			n.join = joins
		}
	}
	return s
}

// add starts a broker (not a voter) joining the site.
func (s *testSite) add(id string) *testNode {
	s.tb.Helper()
	return s.start(id, false, 0)
}

// start starts node id with the site's configuration.
func (s *testSite) start(id string, voter bool, expect int) *testNode {
	s.tb.Helper()
	n := &testNode{id: id, voter: voter, expect: expect, streams: slices.Clone(s.opts.Streams), site: s}
	if i := len(s.nodes); i < len(s.opts.Dirs) {
		n.dir = s.opts.Dirs[i]
	} else {
		n.dir = s.tb.TempDir()
	}
	if s.first != nil {
		n.join = []string{s.first.serf}
	}
	n.run(s.tb)
	s.nodes = append(s.nodes, n)
	s.tb.Cleanup(func() {
		if s.tb.Failed() {
			s.tb.Logf("log of %s:\n%s", n.id, n.logs)
		}
		if !s.opts.Crash {
			n.stop(s.tb)
		} else if err := n.crash(s.tb); err != nil {
			s.tb.Errorf("close %s: %v", n.id, err)
		}
	})
	return n
}

// run starts the node on its data and addresses.
func (n *testNode) run(tb testing.TB) {
	tb.Helper()
	o := n.site.opts
	cfg := DefaultConfig()
	cfg.NodeID, cfg.Voter, cfg.BootstrapExpect, cfg.Join = n.id, n.voter, n.expect, n.join
	cfg.SerfAddr, cfg.RaftAddr = cmp.Or(n.serf, "127.0.0.1:0"), cmp.Or(n.raft, "127.0.0.1:0")
	cfg.SnapshotDir = n.dir + "/snapshots"
	cfg.MQTTAddr, cfg.Version = "127.0.0.1:1883", "test"
	cfg.ReplaceAfter = o.ReplaceAfter
	cfg.SessionTimeout = cmp.Or(o.SessionTimeout, cfg.SessionTimeout)
	n.logs = &syncBuf{}
	cfg.Logger = slog.New(slog.NewTextHandler(n.logs, nil))
	test := &siteTest{acksLeader: o.AcksLeaderFor, forwardTimeout: o.ForwardTimeout, fetchMaxWait: o.FetchMaxWait,
		probeAfter: o.ProbeAfter, probeWait: o.ProbeWait, noDedupTag: o.NoDedupTag,
		stateFetchTimeout: o.StateFetchTimeout}
	if o.BeforeLead != nil {
		test.beforeLead = func(stream string) { o.BeforeLead(n.id, stream) }
	}
	if o.Net != nil {
		test.transport = onNet(tb, o.Net, n.id, &cfg)
	}
	var scs []logstore.StreamConfig
	for _, x := range n.streams {
		filter := x.Name + "/#"
		if x.Name == "default" {
			filter = "#"
		}
		scs = append(scs, logstore.StreamConfig{Name: x.Name, Filters: []string{filter}})
	}
	store, err := logstore.Open(logstore.Config{Dir: n.dir + "/store", Profile: logstore.ProfilePiZero,
		Streams: append(scs, logStreams(tb, o.Stored)...), RetentionInterval: time.Hour, MinFreeBytes: cmp.Or(o.MinFree, -1),
		ManualCommit: true})
	if err != nil {
		tb.Fatal(err)
	}
	s, err := StartSite(SiteConfig{Node: cfg, TransportListen: cmp.Or(n.trans, "127.0.0.1:0"), Store: store,
		Streams: n.streams, MinInsyncReplicas: o.MinISR, LagMax: o.LagMax, LeaderBalanceAfter: o.LeaderBalanceAfter,
		Logger: cfg.Logger, test: test})
	if err != nil {
		_ = store.Close()
		tb.Fatalf("start %s: %v", n.id, err)
	}
	n.Site, n.store, n.down = s, store, false
	// The next start takes the same addresses, the ports picked now.
	n.serf, n.raft, n.trans = s.Node.SerfAddr(), s.Node.RaftAddr(), s.Node.cfg.ClusterAddr
}

// onNet puts node id's cluster transport and Raft (as id+"/raft") on
// fnet, dialling through it: it sets cfg's Dial and RaftListener and
// returns the transport's listener.
func onNet(tb testing.TB, fnet *faultnet.Network, id string, cfg *Config) net.Listener {
	tb.Helper()
	ln, err := fnet.Listen(id)
	if err == nil {
		cfg.RaftListener, err = fnet.Listen(id + "/raft")
	}
	if err != nil {
		tb.Fatal(err)
	}
	cfg.Dial = fnet.Dialer(id)
	return ln
}

// stop is `peat serve` stopping on SIGTERM: a hand-over, then everything
// closes. A node down already stays so.
func (n *testNode) stop(tb testing.TB) {
	tb.Helper()
	if n.down {
		return
	}
	n.down = true
	if err := n.Close(); err != nil {
		tb.Logf("close %s: %v", n.id, err)
	}
	if err := n.store.Close(); err != nil {
		tb.Errorf("close %s's store: %v", n.id, err)
	}
}

// crash stops the node as kill -9 would: no hand-over, no leave. It
// reports what failed to close.
func (n *testNode) crash(tb testing.TB) error {
	tb.Helper()
	if n.down {
		return nil
	}
	n.down = true
	return errors.Join(stopSite(n.Site), n.store.Close())
}

// stopSite stops s as kill -9 stops a node: its loops, then its parts,
// with no hand-over and no leave (the others find it failed). The store
// stays open.
func stopSite(s *Site) error {
	close(s.stop)
	s.wg.Wait()
	err := s.Log.Close()
	s.Replicator.Close()
	_ = s.Server.Close()
	return errors.Join(err, s.Node.Close())
}

// restart starts a node that is down again on its data and addresses,
// with streams as its configuration's list when any are given, as a real
// node restarts with an edited configuration.
func (n *testNode) restart(tb testing.TB, streams ...SiteStream) {
	tb.Helper()
	if !n.down {
		tb.Fatalf("restart %s: not down", n.id)
	}
	if streams != nil {
		n.streams = streams
	}
	n.run(tb)
}
