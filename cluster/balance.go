package cluster

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/peatmq/peat/cluster/rules"
)

// Leader balancing (Kafka's preferred replica election, the rule being
// rules.PlanLeaders): after a failover, a node that returns is a
// follower of every stream it led; on the controller, manage elects it
// again once it has been alive, in the ISR and not leading for
// Config.LeaderBalanceAfter (cluster.leader_balance_after, 5 min, 0:
// never), counted in the controller's memory, one stream per pass. The
// change is the controlled one: the old leader stops committing once its
// state names another, and the new one, an ISR member, holds everything
// acknowledged under acks=all; appends in flight on the old leader are
// refused (clients resend). Streams with acks: leader are moved by their
// leader itself (handOff), on the same rule counted in its own memory: it
// drains the stream as a hand-over does, then submits the ElectLeader;
// if the followers did not catch up, or the election was not made and
// its state still names it, it takes appends again.
//
// A stream's factor comes from the configuration (replication_factor,
// the stream's or the site's; 0 leaves it): setFactors submits
// SetReplicationFactor once per run, once this node's registration in
// its broker epoch is applied (its state is then recent): the node
// started last wins. "The controller's configuration wins" would flap in
// a rolling restart that changes it, as the controller moves between
// nodes with the old and the new value.

// balanceRetry paces manage while it waits for the controller or for
// this node's registration.
const balanceRetry = 2 * time.Second

// manage runs the two things a node's configuration asks of a running
// site beside creating streams:
//
//   - a stream's replication_factor, set in the configuration, that
//     differs from the factor in the state is submitted once per run,
//     once this node's state has caught up with the controller (its own
//     registration in this broker epoch is applied): the node started
//     last wins, and a rolling restart that changes the value on every
//     node moves replicas once, never back and forth as it would if each
//     controller in turn applied its own configuration;
//   - on the controller, leader balancing (LeaderBalanceAfter); on a
//     leader, the same for the acks: leader streams it leads;
//   - on a leaving leader (draining, or a move's source), the hand-over
//     of its acks: leader streams (Log.leaveLeads).
func (s *Site) manage() {
	defer s.wg.Done()
	done := map[string]bool{} // streams whose factor this run has settled
	var b balancer
	leaving := map[string]time.Time{} // Log.leaveLeads' last failed try, by stream
	for {
		st, changed := s.Node.State()
		s.setFactors(st, done)
		wait := balanceRetry
		now := time.Now()
		next := earliest(s.Log.leaveLeads(leaving, now), s.balanceLeaders(&b, st, now))
		if !next.IsZero() {
			wait = min(wait, max(time.Until(next), 0))
		}
		t := time.NewTimer(wait)
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

// setFactors submits SetReplicationFactor for each configured stream
// whose factor the configuration sets and the state differs from.
func (s *Site) setFactors(st *rules.State, done map[string]bool) {
	if b := st.Brokers[s.Node.ID()]; b == nil || b.Epoch != s.Node.Epoch() {
		return // this node's state may be older than the site's
	}
	for _, want := range s.cfg.Streams {
		rf := cmp.Or(want.ReplicationFactor, s.cfg.ReplicationFactor)
		x := st.Streams[want.Name]
		if done[want.Name] || rf == 0 || x == nil {
			continue
		}
		if x.Want() == rf {
			done[want.Name] = true
			continue
		}
		s.log.Info("cluster: changing a stream's replication factor", slog.String("stream", want.Name),
			slog.Int("from", x.Want()), slog.Int("to", rf))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.Node.Submit(ctx, rules.SetReplicationFactor{Name: want.Name, ReplicationFactor: rf})
		cancel()
		if err != nil {
			s.log.Warn("cluster: replication factor not changed yet", slog.String("stream", want.Name), slog.Any("err", err))
			continue
		}
		done[want.Name] = true
	}
}

// balancer is what the controller remembers for leader balancing: when
// it first saw each stream's preferred replica able to lead and not
// leading. A new controller starts counting again, as replace_after's
// count does.
type balancer struct {
	since map[string]time.Time
	// mine is the same count on a stream's leader, for the acks: leader
	// streams it leads (handOff).
	mine map[string]time.Time
}

// balanceLeaders is Kafka's preferred replica election: a stream's
// first replica (not leaving) is its preferred leader; once it has been
// alive and in the ISR, and not the leader, for LeaderBalanceAfter, the
// controller makes it leader again (ElectLeader). One stream per pass
// (each election wakes the next pass), so leaderships come back one at
// a time. The change is the controlled one a hand-over makes: the old
// leader stops committing as soon as its state names another, the new
// one, an ISR member, holds every record acknowledged under acks=all
// and leads from its log end; publishes in flight on the old leader are
// refused and sent again by their clients. Streams with acks: leader
// are left to their leader (handOff): it may have acknowledged records
// its followers have not fetched yet, which a change made here would
// lose.
// It returns when the next stream is due (zero: none).
func (s *Site) balanceLeaders(b *balancer, st *rules.State, now time.Time) (next time.Time) {
	after := s.cfg.LeaderBalanceAfter
	if after <= 0 {
		b.since, b.mine = nil, nil
		return time.Time{}
	}
	next = s.handOff(b, st, now, after)
	if !s.Node.IsController() {
		b.since = nil
		return next
	}
	if b.since == nil {
		b.since = map[string]time.Time{}
	}
	acksLeader := map[string]bool{}
	for _, c := range s.cfg.Streams {
		acksLeader[c.Name] = c.AcksLeader
	}
	elect, due := rules.PlanLeaders(st, b.since, now, after, func(name string) bool { return acksLeader[name] })
	if elect == nil {
		return earliest(next, due)
	}
	x := st.Streams[elect.Name]
	s.log.Info("cluster: leader balancing: the preferred replica leads again", slog.String("stream", elect.Name),
		slog.String("from", x.Leader), slog.String("to", elect.Preferred))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Node.Submit(ctx, *elect); err != nil {
		s.log.Warn("cluster: leader balancing", slog.String("stream", elect.Name), slog.Any("err", err))
	}
	delete(b.since, elect.Name) // counted afresh if it is still due
	return now.Add(balanceRetry)
}

// handOff is leader balancing for the acks: leader streams this node
// leads, which the controller leaves alone: their leader may have
// answered records no follower holds, so the leader moves them itself.
// Once a stream's preferred replica has been eligible for after (counted
// here), it drains the stream as a hand-over does (Log.drain: appends
// and state writes refused, every ISR member caught up), then submits
// the ElectLeader; when either fails it takes appends again. It returns
// when the next stream is due (zero: none).
func (s *Site) handOff(b *balancer, st *rules.State, now time.Time, after time.Duration) time.Time {
	if b.mine == nil {
		b.mine = map[string]time.Time{}
	}
	self := s.Node.ID()
	elect, next := rules.PlanLeaders(st, b.mine, now, after, func(name string) bool {
		return st.Streams[name].Leader != self || !s.Log.acksLeader(name)
	})
	if elect == nil {
		return next
	}
	delete(b.mine, elect.Name) // counted afresh if it is still due
	if err := s.Log.electDrained(*elect); err != nil {
		s.log.Warn("cluster: leader balancing", slog.String("stream", elect.Name), slog.Any("err", err))
		return now.Add(balanceRetry)
	}
	s.log.Info("cluster: leader balancing: the preferred replica leads again", slog.String("stream", elect.Name),
		slog.String("from", self), slog.String("to", elect.Preferred))
	return now.Add(balanceRetry)
}

var (
	// errNotCaughtUp: a drain before a change of leader ran out of time.
	errNotCaughtUp = errors.New("followers not caught up")
	errNotLeading  = errors.New("this node does not lead the stream")
)

// electDrained moves the leadership of an acks: leader stream this node
// leads as elect says, losing nothing it acknowledged: it drains the
// stream as a hand-over does (drain: appends and state writes refused,
// every ISR member caught up), then submits elect; when either fails it
// takes appends again (Leader.Resume).
func (l *Log) electDrained(elect rules.ElectLeader) error {
	ld, _ := l.rep.Leading(elect.Name)
	if ld == nil {
		return errNotLeading
	}
	ctx, cancel := context.WithTimeout(context.Background(), handOverTimeout)
	defer cancel()
	if _, held := l.drain(ctx, elect.Name, ld, handOverTimeout*2/5); !held {
		ld.Resume()
		return errNotCaughtUp
	}
	if err := l.node.Submit(ctx, elect); err != nil {
		// A Submit that timed out may still have been applied: resume
		// only a leadership the state still gives this node, or a
		// deposed leader would answer appends no one will hold.
		if !l.leadershipEnded(elect.Name, ld.epoch, balanceRetry) {
			ld.Resume()
		}
		return err
	}
	return nil
}

// leaveLeads hands over the acks: leader streams this node leads and is
// leaving (its broker draining, or a move's source), which the
// controller holds for it (rules.PlanMovesHolding): once the controller would
// drop its replica (the kept replicas caught up), it elects the first
// kept, alive ISR member after a drain (electDrained), so nothing it
// acknowledged is lost; the controller then drops it. A stream it failed
// on is tried again after balanceRetry (tried); the controller gives up
// waiting after handOffLimit. It returns when the next try is due (zero:
// none).
func (l *Log) leaveLeads(tried map[string]time.Time, now time.Time) (next time.Time) {
	st, _ := l.node.State()
	self := l.node.ID()
	for _, c := range rules.PlanMoves(st) {
		x := st.Streams[c.Name]
		if x.Leader != self || slices.Contains(c.Replicas, self) || !l.acksLeader(c.Name) {
			continue
		}
		if due := tried[c.Name].Add(balanceRetry); now.Before(due) {
			next = earliest(next, due)
			continue
		}
		i := slices.IndexFunc(c.Replicas, func(r string) bool { return x.InISR(r) && st.Alive(r) })
		if i < 0 {
			continue
		}
		elect := rules.ElectLeader{Name: c.Name, Preferred: c.Replicas[i]}
		if err := l.electDrained(elect); err != nil {
			tried[c.Name] = now
			next = earliest(next, now.Add(balanceRetry))
			l.log.Warn("cluster: leaving: leadership not handed over yet", slog.String("stream", c.Name), slog.Any("err", err))
			continue
		}
		delete(tried, c.Name)
		l.log.Info("cluster: leaving: leadership handed over", slog.String("stream", c.Name), slog.String("to", elect.Preferred))
	}
	return next
}

// leadershipEnded waits up to d for this node's state to show that its
// leadership of stream name in epoch has ended.
func (l *Log) leadershipEnded(name string, epoch uint32, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		st, changed := l.node.State()
		if x := st.Streams[name]; x == nil || x.Leader != l.node.ID() || x.LeaderEpoch != epoch {
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return false
		}
	}
}

// earliest is the earlier of two due times, zero being none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
