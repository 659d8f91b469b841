package cluster

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/peatmq/peat/cluster/rules"
)

// isrCheck bounds how long a leader waits before it proposes a change
// of its ISR it could make (maintainISR).
const isrCheck = 500 * time.Millisecond

// maintainISR is a leader's side of ISR maintenance: every quarter of
// LagMax, or every isrCheck if sooner, it asks the controller (Submit,
// wherever it runs) to drop the followers not caught up for LagMax or not
// heard from (no fetch) for the session timeout, and to
// add those caught up in their current broker epoch (it asks only when
// there is a change to make: a look costs no I/O). A replica back after
// a healed link is in the ISR within isrCheck of catching up. The Leader applies an ISR only once the controller
// committed it (sync's SetISR): a smaller ISR never moves the watermark
// before the controller agreed, and an AlterISR in a stale leader epoch or
// version is refused there (a deposed leader cannot shrink its ISR).
//
// A larger ISR is the other way round: the controller may elect a joiner
// as soon as it committed it, so the watermark counts every joiner from
// its proposal until the Leader has an ISR with it (Kafka's maximal ISR,
// KIP-497), and drops it only on a refusal that says it is not in the
// ISR, or when a later proposal, from a state without it, does not name
// it again. A proposal whose outcome is unknown (no answer in time) may
// still commit while the stream's version is the one it named: its
// joiners are kept until the version moves (rules.StillJoining).
func (r *Replicator) maintainISR(ctx context.Context, ro *role, name string) {
	defer close(ro.done)
	tick := time.NewTicker(min(max(r.cfg.LagMax/4, 50*time.Millisecond), isrCheck))
	defer tick.Stop()
	var unanswered rules.Unanswered
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c, added, committed, version, ok := r.proposeISR(ro, name)
		// The watermark waits for the joiners proposed, and for those the
		// state's ISR already holds: the Leader counts them as ISR members
		// only once sync hands it that ISR, which may come later (a busy
		// Replicator), and the controller may elect them from now on.
		ro.l.KeepJoining(rules.StillJoining(committed, added, unanswered, version))
		if !ok {
			continue
		}
		r.log.Info("cluster: proposing ISR", slog.String("stream", name), slog.Any("isr", c.ISR), slog.Uint64("version", c.Version))
		sctx, cancel := context.WithTimeout(ctx, r.cfg.LagMax)
		err := r.cfg.Node.Submit(sctx, c)
		cancel()
		switch {
		case err != nil && !isRefusal(err):
			// It may commit yet; so may an earlier one in the same version.
			unanswered = rules.Unanswered{Version: c.Version,
				Added: rules.StillJoining(added, nil, unanswered, c.Version)}
		case err == nil || c.Version != unanswered.Version:
			unanswered = rules.Unanswered{} // the version has moved: the earlier one is decided
		}
		if err != nil {
			// Only a refusal in the version proposed says the joiners are
			// not in the ISR (Kafka's INELIGIBLE_REPLICA). A stale
			// version, or no answer, may follow an addition the controller
			// made and this node's state does not show yet: the watermark
			// keeps waiting for them until the next tick's proposal, from
			// a newer state, says again (Kafka keeps its maximal ISR
			// "awaiting the latest metadata").
			if errors.Is(err, ErrIneligibleReplica) || errors.Is(err, ErrStaleBrokerEpoch) {
				ro.l.KeepJoining(rules.StillJoining(committed, nil, unanswered, c.Version))
			}
			if ctx.Err() == nil {
				r.log.Info("cluster: ISR change not made", slog.String("stream", name), slog.Any("err", err))
			}
		}
	}
}

// proposeISR is the AlterISR the leader should ask for now, if any, the
// replicas it adds (rules.ProposeISR on this node's state and the
// Leader's tracker), and the ISR of that state.
func (r *Replicator) proposeISR(ro *role, name string) (c rules.AlterISR, added, isr []string, version uint64, ok bool) {
	st := r.cfg.Node.View()
	s := st.Streams[name]
	if s == nil || s.Leader != r.cfg.Node.ID() || s.LeaderEpoch != ro.epoch {
		return rules.AlterISR{}, nil, nil, 0, false // the state moved on; sync replaces this role
	}
	c, added, ok = rules.ProposeISR(st, name, r.cfg.Node.ID(), ro.epoch, ro.l.Laggards(time.Now(), r.cfg.LagMax, r.cfg.Node.cfg.SessionTimeout), ro.l.Joiners())
	return c, added, s.ISR, s.Version, ok
}
