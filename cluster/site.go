package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
)

// A node of a site.
//
// StartSite is what `peat serve` runs with a `cluster:` section: the Node,
// a Server on the transport address, the Replicator and the Log over the
// node's store (ManualCommit). Every node has the controller create the
// streams of its configuration once ReplicationFactor brokers are alive
// (default: the voters, at most 3), on replicas picked from the sorted
// alive brokers from a place the stream's name decides, so that leaders
// spread; nodes race harmlessly (a second creation with other replicas
// is refused with ErrStreamExists). A site with fewer brokers creates it
// on those it has once every alive member has been registered for
// siteSettle (5 s; a forming site registers members one by one), with
// its ReplicationFactor in the state, and the controller adds replicas
// as brokers join. min_insync_replicas defaults per stream: 2 from 3
// replicas on, else 1.
//
// While it sees no other alive member it joins its Join addresses again
// every 2 s (Consul's retry_join): a node restarted while the others were
// down finds them when they are back. Serf's snapshot file keeps the
// members it knew as well, but is written only as events arrive, so a
// kill -9 may lose its last lines.
//
// Close is a controlled shutdown (HandOver): the node reports itself
// failed in its own broker epoch through the controller, which fences it
// at once (out of every ISR, new leaders for its streams), and a
// controller hands Raft's leadership to another voter; then everything
// closes. Without it the streams it led would wait for Serf's failure
// detection before taking publishes again, and acks=all would wait for a
// follower that has gone.
//
// An acks: leader stream's leader has answered records and state writes
// its followers may not hold yet, and BrokerFailed elects at once. So
// first, on each such stream it leads with another ISR member (all at
// once), it drains (Leader.Drain, Log.drainAcksLeader): it refuses
// appends and state writes with ErrLeaderUnavailable, as while a leader
// moves (clients resend to the next), waits for those admitted, then
// until every ISR member, and every joiner the watermark counts, has
// fetched to its log end and acknowledged its state writes. Waiting for
// all, not one, leaves the election as it is: it takes the first ISR
// member in replica order, and each then holds everything answered. A
// follower that stopped fetching stays in the ISR for the session timeout
// and must not hold the stop: the drain gets 2 s of the hand-over's 5 s;
// then the leader shrinks the ISR (AlterISR) to the followers at its log
// end, if some are, so that one of them is elected. With none, it hands
// over as before, and what it alone held is lost (logged). A follower
// fetches while the leader waits: the Server and the Replicator close
// after HandOver. A crash still loses what acks=leader answered.

// SiteConfig is one node's part in a site as `peat serve` runs it: the
// Node, the Server on TransportListen, the Replicator and the Log, and
// the streams of the node's configuration, which the controller creates.
type SiteConfig struct {
	Node Config // Node.ClusterAddr is set from TransportListen

	// TransportListen is where the Server answers replica fetches and
	// controller commands (host:port with a specific IP; port 0 picks one).
	TransportListen string

	// Store is the node's log, opened with ManualCommit.
	Store *logstore.Store

	// Streams are created through the controller once enough brokers are
	// alive. Every node of a site must configure the same streams: a
	// replica whose store lacks the stream never serves it.
	Streams []SiteStream

	// ReplicationFactor is how many replicas a new stream gets; 0: the
	// number of voters, at most 3.
	ReplicationFactor int
	// MinInsyncReplicas: a leader whose ISR is smaller commits nothing; 0:
	// 2 for a stream of 3 or more replicas, else 1.
	MinInsyncReplicas int
	LagMax            time.Duration // replica_lag_max; 0: DefaultReplicaLagMax

	// LeaderBalanceAfter: a stream's preferred leader (its first replica)
	// that has been alive and in the ISR this long leads it again
	// (balance.go: the controller elects it, or for an acks: leader
	// stream the leader hands over); 0: never.
	LeaderBalanceAfter time.Duration

	// Mirror applies the mirror rules on the leader of a mirror stream
	// (LogConfig.Mirror): edge/mirror.Apply. nil: Log.Mirror refuses.
	Mirror MirrorApply

	Logger *slog.Logger

	// test is set only by this package's tests (testsite_test.go); nil
	// for every node a configuration starts.
	test *siteTest
}

// siteTest is what a test of this package sets on a SiteConfig that no
// configuration can: the transport on faultnet, and the Log's choices of
// a node its tests drive by hand (streams they create on replicas of
// their choosing, acks flipped at run time).
type siteTest struct {
	// transport replaces the listener on TransportListen (which is then
	// not used); Node.Dial and Node.RaftListener go with it.
	transport net.Listener
	// acksLeader replaces the Streams' AcksLeader settings, for the Log
	// and the Node alike.
	acksLeader     func(stream string) bool
	forwardTimeout time.Duration       // LogConfig.ForwardTimeout; 0: its default
	fetchMaxWait   time.Duration       // ReplicatorConfig.FetchMaxWait; 0: its default
	beforeLead     func(stream string) // ReplicatorConfig.beforeLead
	// probeAfter and probeWait: LogConfig's; 0: the defaults.
	probeAfter, probeWait time.Duration
	stateFetchTimeout     time.Duration // LogConfig's; 0: its default
	noDedupTag            bool          // Config's
}

// SiteStream is a stream of the configuration; zero fields take the
// site's settings.
type SiteStream struct {
	Name              string
	ReplicationFactor int
	MinInsyncReplicas int
	UncleanElection   bool
	// AcksLeader: the leader acknowledges once written locally, not once
	// the ISR holds it (LogConfig.AcksLeader).
	AcksLeader bool
}

// Site is a running node of a site. Close stops it.
type Site struct {
	Node       *Node
	Server     *Server
	Replicator *Replicator
	Log        *Log

	controllerChanges atomic.Uint64 // watchControllers
	fewSince          time.Time     // settled; only createStreams touches it

	cfg  SiteConfig
	log  *slog.Logger
	stop chan struct{}
	wg   sync.WaitGroup
}

// StartSite opens the node and everything that serves its streams. On
// error what it opened is closed again; the store stays open (the
// caller's).
func StartSite(cfg SiteConfig) (*Site, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Store == nil {
		return nil, errors.New("cluster: no store")
	}
	if cfg.ReplicationFactor < 0 || cfg.ReplicationFactor > 5 {
		return nil, fmt.Errorf("cluster: replication factor %d: want 1 to 5, or 0 for the default", cfg.ReplicationFactor)
	}
	if cfg.MinInsyncReplicas < 0 || (cfg.ReplicationFactor > 0 && cfg.MinInsyncReplicas > cfg.ReplicationFactor) {
		return nil, fmt.Errorf("cluster: min_insync_replicas %d: want 0 to the replication factor %d",
			cfg.MinInsyncReplicas, cfg.ReplicationFactor)
	}
	if cfg.LeaderBalanceAfter < 0 {
		return nil, fmt.Errorf("cluster: leader_balance_after %v: want 0 (never) or more", cfg.LeaderBalanceAfter)
	}
	test := cmp.Or(cfg.test, &siteTest{})
	if err := checkAddr(cfg.TransportListen); err != nil && test.transport == nil {
		return nil, fmt.Errorf("cluster: transport address: %w", err)
	}
	for _, st := range cfg.Streams {
		if st.Name == SessionsStream {
			return nil, fmt.Errorf("cluster: stream name %q is reserved for the site's durable sessions", SessionsStream)
		}
	}
	// The sessions' stream is created (and its factor changed) with the
	// others, at the largest of their factors; the store gets it at every
	// start (nothing records a stream added at run time), finding its
	// state again.
	if cfg.Store.Stream(SessionsStream) == nil {
		if _, err := cfg.Store.AddStream(sessionsStreamConfig()); err != nil {
			return nil, fmt.Errorf("cluster: sessions' stream: %w", err)
		}
	}
	cfg.Streams = append(slices.Clip(cfg.Streams), SiteStream{Name: SessionsStream, ReplicationFactor: sessionsFactor(cfg)})
	ln := test.transport
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.TransportListen); err != nil {
			return nil, fmt.Errorf("cluster: transport: %w", err)
		}
	}
	cfg.Node.ClusterAddr = ln.Addr().String()
	if cfg.Node.Logger == nil {
		cfg.Node.Logger = log
	}
	settings := map[string]SiteStream{} // each configured stream's own settings, by name
	for _, st := range cfg.Streams {
		settings[st.Name] = st
	}
	acksLeader := func(name string) bool { return settings[name].AcksLeader }
	if test.acksLeader != nil {
		acksLeader = test.acksLeader
	}
	cfg.Node.AcksLeader = acksLeader
	cfg.Node.noDedupTag = test.noDedupTag
	node, err := Open(cfg.Node, cfg.Store)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	srv := Serve(node.ClusterListener(ln), log.With(slog.String("component", "cluster-server")))
	srv.ServeNode(node)
	rep := StartReplicator(ReplicatorConfig{
		Node: node, Server: srv, Stream: currentReplica(node, cfg.Store), LagMax: cfg.LagMax,
		MinInsyncReplicas: cfg.MinInsyncReplicas, Log: log, FetchMaxWait: test.fetchMaxWait,
		MinInsyncFor: func(name string) int { return settings[name].MinInsyncReplicas },
		beforeLead:   test.beforeLead,
	})
	s := &Site{
		Node: node, Server: srv, Replicator: rep,
		Log: NewLogConfig(node, cfg.Store, rep, LogConfig{Log: log.With(slog.String("component", "cluster-log")),
			AcksLeader: acksLeader, Mirror: cfg.Mirror, ForwardTimeout: test.forwardTimeout,
			probeAfter: test.probeAfter, probeWait: test.probeWait, stateFetchTimeout: test.stateFetchTimeout}),
		cfg: cfg, log: log, stop: make(chan struct{}),
	}
	s.watchControllers()
	s.wg.Add(3)
	go s.createStreams()
	go s.rejoin()
	go s.manage()
	s.wg.Add(1)
	go s.followDeletions()
	return s, nil
}

// Close stops serving: it hands over (HandOver), then closes the Log, the
// Replicator, the Server and the Node, which to the others has failed (a
// restart comes back in a new broker epoch and catches up before it
// rejoins the ISR).
func (s *Site) Close() error {
	close(s.stop)
	s.wg.Wait()
	s.HandOver(handOverTimeout)
	lerr := s.Log.Close()
	s.Replicator.Close()
	serr := s.Server.Close()
	return errors.Join(lerr, serr, s.Node.Close())
}

// handOverTimeout bounds a graceful stop's hand-over; past it the others
// find the node failed as after a crash.
const handOverTimeout = 5 * time.Second

// StreamLeader returns the leader of stream that the controller's state
// names and its epoch, and whether this node is that leader and runs its
// Leader now: where a stream is read from for what acts as its leader
// outside the log (a site's sinks). leader is "" for a stream the state
// does not hold.
func (s *Site) StreamLeader(stream string) (leader string, epoch uint32, here bool) {
	cs := s.Node.View().Streams[stream]
	if cs == nil {
		return "", 0, false
	}
	ld, _ := s.Replicator.Leading(stream)
	return cs.Leader, cs.LeaderEpoch, ld != nil && cs.Leader == s.Node.ID()
}

// LeadersChanged returns a channel closed when the Replicator next looks
// at the state: after every change of a stream's leader, here or
// elsewhere.
func (s *Site) LeadersChanged() <-chan struct{} {
	_, ch := s.Replicator.Leading("")
	return ch
}

// HearsController is Node.HearsController: false while what this node
// leads may have been moved without its knowing.
func (s *Site) HearsController() bool { return s.Node.HearsController() }

// HandOver is a controlled shutdown (Kafka's): the node reports itself
// failed in its own broker epoch, so the controller fences it now (out of
// every ISR, new leaders for the streams it led) instead of after Serf's
// failure detection, and a controller hands Raft's leadership to another
// voter. Publishes to the streams it led move within a round trip, not
// seconds. First, on each acks: leader stream it leads, it stops taking
// appends and waits for its ISR followers to fetch what it acknowledged
// (Leader.Drain), for at most 2/5 of timeout. Only call it on the way
// out: the node leaves every ISR.
func (s *Site) HandOver(timeout time.Duration) {
	node, log := s.Node, s.log
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// A follower that fetches catches up within a round trip; one that
	// does not must not hold the stop: the rest of the time is for the
	// controller's election and Raft's transfer.
	if behind := s.Log.drainAcksLeader(ctx, timeout*2/5); len(behind) > 0 {
		log.Warn("cluster: hand-over: no follower caught up; records only this node holds may be lost",
			slog.Any("streams", behind))
	}
	self := node.ID()
	st, _ := node.State()
	for _, x := range st.Streams {
		if slices.Contains(x.ISR, self) && len(x.ISR) > 1 {
			if err := node.Submit(ctx, rules.BrokerFailed{ID: self, Epoch: node.Epoch()}); err != nil {
				log.Warn("cluster: hand-over: the others find this node failed by themselves", slog.Any("err", err))
			}
			break
		}
	}
	if node.IsController() {
		if err := node.raft.LeadershipTransfer().Error(); err != nil {
			log.Warn("cluster: hand-over: controller not transferred", slog.Any("err", err))
		}
	}
}

// siteRetry paces createStreams while the controller or brokers are
// missing; state changes wake it sooner.
const siteRetry = time.Second

// createStreams has the controller create each configured stream that
// its state lacks, once ReplicationFactor brokers are alive. Nodes race
// harmlessly: the first creation wins, a later one with other replicas is
// refused with ErrStreamExists.
func (s *Site) createStreams() {
	defer s.wg.Done()
	waiting := ""
	for {
		st, changed := s.Node.State()
		missing, err := s.createMissing(st)
		if err != nil && err.Error() != waiting {
			waiting = err.Error()
			s.log.Info("cluster: streams not created yet", slog.String("reason", waiting))
		}
		if !missing {
			if waiting != "" {
				s.log.Info("cluster: every configured stream exists")
			}
			waiting = ""
		}
		t := time.NewTimer(siteRetry)
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// createMissing submits a CreateStream for each configured stream st
// lacks; missing reports whether any was.
func (s *Site) createMissing(st *rules.State) (missing bool, err error) {
	var alive []string
	for id, b := range st.Brokers {
		if b.Alive && !b.Draining {
			alive = append(alive, id)
		}
	}
	slices.Sort(alive)
	for _, want := range s.cfg.Streams {
		if st.Streams[want.Name] != nil {
			continue
		}
		missing = true
		rf, err := s.replicationFactor(want)
		if err != nil {
			return true, err
		}
		on := rf
		if len(alive) < rf {
			if !s.settled(st, len(alive)) {
				return true, fmt.Errorf("%d of %d brokers alive for replication factor %d", len(alive), rf, rf)
			}
			on = len(alive) // the controller adds the others as brokers join (reassign.go)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = s.Node.Submit(ctx, rules.CreateStream{Name: want.Name, Replicas: rules.PickReplicas(want.Name, alive, on),
			UncleanElection: want.UncleanElection, ReplicationFactor: rf})
		cancel()
		if err != nil && !errors.Is(err, ErrStreamExists) {
			return true, fmt.Errorf("create %s: %w", want.Name, err)
		}
	}
	return missing, nil
}

// siteSettle is how long a site with fewer alive brokers than a
// stream's replication factor must stay so, every alive member
// registered, before the stream is created on the brokers there are.
const siteSettle = 5 * time.Second

// settled reports whether the alive brokers of st are all the site has
// for now: every alive Serf member is registered alive in its current
// epoch, and has been for siteSettle (a site still forming registers
// its members one by one; creating streams then would put every one on
// the first). Only createStreams calls it.
func (s *Site) settled(st *rules.State, alive int) bool {
	all := alive > 0
	for _, m := range s.Node.Members() {
		if m.Status != "alive" {
			continue
		}
		if b := st.Brokers[m.ID]; b == nil || !b.Alive || b.Epoch != m.Epoch {
			all = false
		}
	}
	if !all {
		s.fewSince = time.Time{}
		return false
	}
	if s.fewSince.IsZero() {
		s.fewSince = time.Now()
	}
	return time.Since(s.fewSince) >= siteSettle
}

// rejoin joins cfg.Node.Join again while this node sees no other alive
// member (Consul's retry_join): a node restarted while the members it
// names were down, or before them, finds the site once one is back.
// Serf's own reconnects try failed members only, and only members it
// knew.
func (s *Site) rejoin() {
	defer s.wg.Done()
	// Every node may list the whole site, itself included.
	join := slices.DeleteFunc(slices.Clone(s.cfg.Node.Join), func(a string) bool { return a == s.Node.SerfAddr() })
	if len(join) == 0 {
		return
	}
	t := time.NewTicker(rejoinInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		alone := true
		for _, m := range s.Node.Members() {
			if m.ID != s.Node.ID() && m.Status == "alive" {
				alone = false
				break
			}
		}
		if alone {
			if n, err := s.Node.Join(join); err == nil && n > 0 {
				s.log.Info("cluster: rejoined the site", slog.Any("join", join))
			}
		}
	}
}

// rejoinInterval paces rejoin.
const rejoinInterval = 2 * time.Second

// replicationFactor is the stream's, else the site's, else the voters
// up to 3.
func (s *Site) replicationFactor(st SiteStream) (int, error) {
	if rf := cmp.Or(st.ReplicationFactor, s.cfg.ReplicationFactor); rf > 0 {
		return rf, nil
	}
	voters, _, err := s.Node.Quorum()
	if err != nil {
		return 0, err
	}
	if len(voters) == 0 {
		return 0, errors.New("no controller quorum yet")
	}
	return min(3, len(voters)), nil
}

// sessionsFactor is the sessions' stream's replication factor: the
// largest of the configured streams' (0: the site's default), so that
// the sessions outlive as many failures as the records they point into.
func sessionsFactor(cfg SiteConfig) int {
	rf := 0
	for _, st := range cfg.Streams {
		if f := cmp.Or(st.ReplicationFactor, cfg.ReplicationFactor); f > rf {
			rf = f
		}
	}
	return rf
}
