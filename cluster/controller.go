package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"
	"github.com/peatmq/peat/cluster/rules"
)

// The controller.
//
// Serf is only eventually consistent: it cannot keep two nodes from both
// acting as controller after a partition. The controller is therefore the
// hashicorp/raft leader among the voters (1, 3 or 5), the Consul pattern:
//
//   - Voters with no Raft state bootstrap once BootstrapExpect of them are
//     alive in Serf, all with the same configuration (the alive voters in
//     id order). A node added to a running site has BootstrapExpect 0.
//   - The leader runs leaderLoop: after a Barrier (every earlier entry
//     applied) it reconciles Serf's members with the Raft configuration
//     and the state, at once, on every member event and every
//     ReconcileInterval. An alive voter outside the configuration is added
//     as a voter, a broker as a non-voter (it follows the state without
//     voting); an alive member in a new epoch is registered; a failed or
//     departed one is reported failed, which takes it out of every ISR at
//     once; one that left gracefully or was reaped leaves the
//     configuration. A failed voter stays in it, as in Consul: removing it
//     would shrink the quorum on a guess; one removed for good
//     (reassign.go) leaves it.
//   - Raft's log and stable store are a RaftStore in the node's own Badger
//     database (logstore's key-value space: no second storage engine);
//     snapshots use raft's file snapshot store.
//
// Raft's timings default to raft's (1 s heartbeat and election timeouts,
// 500 ms lease; pre-vote on, as raft v1.7 has it).

const (
	raftMaxPool = 3
	// raftConnTimeout bounds a Raft dial and each RPC's I/O (scaled up
	// for a snapshot by its size). A peer silent that long is behind a
	// dead link: 3 s, not raft's usual 10, so that a node back from a
	// partition hears the controller again, and rejoins, within seconds
	// of the heal rather than at the end of a stale RPC.
	raftConnTimeout  = 3 * time.Second
	snapshotsRetain  = 2
	raftLogCacheSize = 512
)

func (n *Node) startRaft() error {
	logger := hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       hclog.Info,
		Output:      logWriter{n.log.With(slog.String("component", "raft"))},
		DisableTime: true,
	})
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(n.cfg.NodeID)
	rc.HeartbeatTimeout = n.cfg.HeartbeatTimeout
	rc.ElectionTimeout = n.cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = n.cfg.LeaderLeaseTimeout
	rc.NotifyCh = n.leaderCh
	rc.Logger = logger
	if err := raft.ValidateConfig(rc); err != nil {
		return fmt.Errorf("cluster: raft config: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(n.cfg.SnapshotDir, snapshotsRetain, logger)
	if err != nil {
		return fmt.Errorf("cluster: raft snapshots in %s: %w", n.cfg.SnapshotDir, err)
	}
	var trans *raft.NetworkTransport
	if n.tls != nil {
		if trans, err = n.tlsRaftTransport(logger); err != nil {
			return err
		}
	} else if n.cfg.RaftListener != nil {
		trans = raft.NewNetworkTransportWithLogger(streamLayer{n.cfg.RaftListener, n.dialer()}, raftMaxPool, raftConnTimeout, logger)
	} else if trans, err = raft.NewTCPTransportWithLogger(n.cfg.RaftAddr, nil, raftMaxPool, raftConnTimeout, logger); err != nil {
		return fmt.Errorf("cluster: raft transport on %s: %w", n.cfg.RaftAddr, err)
	}
	logs, err := raft.NewLogCache(raftLogCacheSize, n.store)
	if err != nil {
		trans.Close()
		return err
	}
	has, err := raft.HasExistingState(logs, n.store, snaps)
	if err != nil {
		trans.Close()
		return fmt.Errorf("cluster: read raft state: %w", err)
	}
	r, err := raft.NewRaft(rc, n.fsm, logs, n.store, snaps, trans)
	if err != nil {
		trans.Close()
		return fmt.Errorf("cluster: start raft: %w", err)
	}
	n.snaps, n.trans, n.raft = snaps, trans, r
	n.mu.bootstrapped = has
	return nil
}

// streamLayer carries Raft over a listener and a Dialer (faultnet in tests).
type streamLayer struct {
	net.Listener
	dial Dialer
}

func (s streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.dial(ctx, string(addr))
}

// watchLeadership runs leaderLoop while this node's Raft server leads.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	type leading struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	var cur *leading
	stopLeading := func() {
		if cur != nil {
			cur.cancel()
			<-cur.done
			cur = nil
		}
	}
	defer stopLeading()
	for {
		select {
		case <-n.stop:
			return
		case leader := <-n.leaderCh:
			n.controlling() // it leads from now on, or did until now
			stopLeading()
			if !leader {
				n.log.Info("cluster: no longer the controller")
				continue
			}
			n.log.Info("cluster: controller")
			ctx, cancel := context.WithCancel(context.Background())
			cur = &leading{cancel: cancel, done: make(chan struct{})}
			go func(done chan struct{}) {
				defer close(done)
				n.leaderLoop(ctx)
			}(cur.done)
		}
	}
}

// leaderLoop is the controller: it brings the state in line with Serf's
// members when it starts, on every member event and every
// ReconcileInterval (events may come while no one leads).
func (n *Node) leaderLoop(ctx context.Context) {
	// Apply nothing before every entry of earlier terms is applied here.
	if err := n.raft.Barrier(n.cfg.ApplyTimeout).Error(); err != nil {
		n.log.Warn("cluster: controller barrier", slog.Any("err", err))
		return // leadership lost, or shutdown; a new leadership starts anew
	}
	n.startSessions(time.Now())
	defer n.endSessions()
	tick := time.NewTicker(n.cfg.ReconcileInterval)
	defer tick.Stop()
	ctl := &control{failedSince: map[string]time.Time{}}
	for {
		// Every change of the state wakes it: a new replica in the ISR
		// lets a move finish (reassign.go).
		st, changed := n.fsm.State()
		if err := n.reconcileAll(ctx); err != nil && ctx.Err() == nil {
			n.log.Warn("cluster: reconcile", slog.Any("err", err))
		}
		now := time.Now()
		next := n.replaceDue(ctx, ctl, st, now)
		held, err := n.reassign(ctx, ctl, now)
		if err != nil && ctx.Err() == nil {
			n.log.Warn("cluster: moving replicas", slog.Any("err", err))
		}
		next = earliest(next, held)
		next = earliest(next, n.nextExpiry(st, now))
		var due <-chan time.Time
		var t *time.Timer
		if !next.IsZero() {
			t = time.NewTimer(time.Until(next))
			due = t.C
		}
		select {
		case <-ctx.Done():
		case <-n.reconcile:
		case <-tick.C:
		case <-changed:
		case <-due:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// reconcileAll compares Serf's members with the Raft configuration and the
// controller's state:
//
//   - an alive voter outside the configuration is added as a voter, an
//     alive broker as a non-voter (it follows the state without voting);
//   - an alive member whose epoch the state does not have is registered
//     (a restart fences its old incarnation, see RegisterBroker);
//   - a failed or departed member in its registered epoch is reported
//     failed: it leaves every ISR at once; so is one Serf shows alive
//     whose broker session expired (heartbeat.go), and its next counted
//     heartbeat registers it again;
//   - a member that left gracefully, or that Serf reaped, leaves the Raft
//     configuration. A failed voter stays in it (as in Consul): removing it
//     would shrink the quorum on a guess;
//   - a member the state marks removed (RemoveBroker: an operator's word,
//     or cluster.replace_after) leaves the Raft configuration and Serf.
func (n *Node) reconcileAll(ctx context.Context) error {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return err
	}
	inRaft := map[string]raft.Server{}
	for _, s := range cf.Configuration().Servers {
		inRaft[string(s.ID)] = s
	}
	state, _ := n.fsm.State()
	var errs []error
	inSerf := map[string]bool{}
	now := time.Now()
	for _, sm := range n.serf.Members() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		m := memberOf(sm)
		inSerf[m.ID] = true
		alive := sm.Status == serf.StatusAlive
		if rules.Forget(state, m.ID, alive) {
			errs = append(errs, n.forgetRemoved(m.ID, &sm, inRaft))
			continue
		}
		b := state.Brokers[m.ID]
		// The state counts a member alive while Serf does and its session
		// holds (heartbeat.go); one Serf sees alive but whose heartbeats
		// stopped is fenced, and stays in Raft's configuration.
		live := alive && n.sessionLive(m, now)
		if alive && !live && b != nil && b.Alive && b.Epoch == m.Epoch {
			n.log.Warn("cluster: fencing a broker whose heartbeats stopped (its session expired)", slog.String("member", m.ID),
				slog.Duration("session_timeout", n.cfg.SessionTimeout))
		}
		c := rules.MemberCommand(state, m.ID, m.Epoch, live)
		switch sm.Status {
		case serf.StatusAlive:
			if b != nil && b.Draining {
				// Leaving: never a voter again, and out of the quorum once
				// its replicas have moved (the quorum keeps its tolerance
				// meanwhile), a non-voter that follows the state while it
				// still serves (remove.go).
				if len(state.ReplicaOf(m.ID)) == 0 {
					errs = append(errs, n.demoteDraining(m, inRaft))
				}
				m.Voter = false
			}
			errs = append(errs, n.addServer(m, inRaft))
			if c != nil {
				errs = append(errs, n.apply(ctx, c))
			}
		case serf.StatusFailed, serf.StatusLeft:
			if c != nil {
				errs = append(errs, n.apply(ctx, c))
			}
			if sm.Status == serf.StatusLeft {
				errs = append(errs, n.removeServer(m.ID, inRaft))
			}
			if rules.Drained(state, m.ID) {
				// Drained and stopped: gone for good (forgetRemoved next).
				n.log.Info("cluster: drained member stopped: removing it", slog.String("member", m.ID))
				errs = append(errs, n.apply(ctx, rules.RemoveBroker{ID: m.ID}))
			}
		}
	}
	n.mu.Lock()
	reaped := n.mu.reaped
	n.mu.reaped = map[string]bool{}
	n.mu.Unlock()
	for id := range reaped {
		errs = append(errs, n.removeServer(id, inRaft))
	}
	for id := range inRaft {
		if b := state.Brokers[id]; b != nil && b.Removed && !inSerf[id] {
			errs = append(errs, n.forgetRemoved(id, nil, inRaft))
		}
	}
	return errors.Join(errs...)
}

func (n *Node) addServer(m Member, inRaft map[string]raft.Server) error {
	if m.RaftAddr == "" {
		return nil
	}
	s, ok := inRaft[m.ID]
	addr := raft.ServerAddress(m.RaftAddr)
	var f raft.IndexFuture
	switch {
	case m.Voter && (!ok || s.Suffrage != raft.Voter || s.Address != addr):
		n.log.Info("cluster: adding voter", slog.String("member", m.ID), slog.String("addr", m.RaftAddr))
		f = n.raft.AddVoter(raft.ServerID(m.ID), addr, 0, n.cfg.ApplyTimeout)
	case !m.Voter && (!ok || s.Address != addr):
		n.log.Info("cluster: adding non-voter", slog.String("member", m.ID), slog.String("addr", m.RaftAddr))
		f = n.raft.AddNonvoter(raft.ServerID(m.ID), addr, 0, n.cfg.ApplyTimeout)
	default:
		return nil
	}
	if err := f.Error(); err != nil {
		return fmt.Errorf("add %s to raft: %w", m.ID, err)
	}
	return nil
}

func (n *Node) removeServer(id string, inRaft map[string]raft.Server) error {
	if _, ok := inRaft[id]; !ok || id == n.cfg.NodeID {
		return nil
	}
	n.log.Info("cluster: removing from raft", slog.String("member", id))
	if err := n.raft.RemoveServer(raft.ServerID(id), 0, n.cfg.ApplyTimeout).Error(); err != nil {
		return fmt.Errorf("remove %s from raft: %w", id, err)
	}
	delete(inRaft, id)
	return nil
}

// apply is Apply for the controller's own commands: a refusal by the
// state machine (a stale epoch, say) is logged, not an error of the loop.
func (n *Node) apply(ctx context.Context, c rules.Command) error {
	err := n.Apply(ctx, c)
	var refused bool
	for _, r := range []error{ErrStaleBrokerEpoch, ErrUnknownBroker} {
		refused = refused || errors.Is(err, r)
	}
	if refused {
		n.log.Info("cluster: controller command refused", slog.String("command", fmt.Sprintf("%T", c)), slog.Any("err", err))
		return nil
	}
	return err
}
