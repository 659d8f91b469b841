package cluster

import (
	"context"
	"log/slog"
	"slices"
	"time"
)

// maintainISR is a leader's side of ISR maintenance: every quarter of
// LagMax it asks the controller (Submit, wherever it runs) to drop the
// followers not caught up for LagMax and to add those caught up in their
// current broker epoch. The Leader applies an ISR only once the controller
// committed it (sync's SetISR): a smaller ISR never moves the watermark
// before the controller agreed, and an AlterISR in a stale leader epoch or
// version is refused there (a deposed leader cannot shrink its ISR).
func (r *Replicator) maintainISR(ctx context.Context, ro *role, name string) {
	defer close(ro.done)
	tick := time.NewTicker(max(r.cfg.LagMax/4, 50*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c, added, ok := r.proposeISR(ro, name)
		ro.l.KeepJoining(added) // the watermark waits for these until the ISR takes them
		if !ok {
			continue
		}
		r.log.Info("cluster: proposing ISR", slog.String("stream", name), slog.Any("isr", c.ISR), slog.Uint64("version", c.Version))
		sctx, cancel := context.WithTimeout(ctx, r.cfg.LagMax)
		err := r.cfg.Node.Submit(sctx, c)
		cancel()
		if err != nil {
			ro.l.KeepJoining(nil)
			if ctx.Err() == nil {
				r.log.Info("cluster: ISR change not made", slog.String("stream", name), slog.Any("err", err))
			}
		}
	}
}

// proposeISR is the AlterISR the leader should ask for now, if any, and
// the replicas it adds.
func (r *Replicator) proposeISR(ro *role, name string) (AlterISR, []string, bool) {
	st, _ := r.cfg.Node.State()
	s := st.Streams[name]
	self := r.cfg.Node.ID()
	if s == nil || s.Leader != self || s.LeaderEpoch != ro.epoch {
		return AlterISR{}, nil, false // the state moved on; sync replaces this role
	}
	laggards := ro.l.Laggards(time.Now(), r.cfg.LagMax)
	joiners := ro.l.Joiners()
	var isr []ISRMember
	for _, id := range s.ISR {
		if b := st.Brokers[id]; b != nil && !slices.Contains(laggards, id) {
			isr = append(isr, ISRMember{ID: id, Epoch: b.Epoch})
		}
	}
	changed := len(isr) != len(s.ISR)
	var added []string
	for _, j := range joiners {
		// Only a replica caught up in the epoch it runs now rejoins.
		if b := st.Brokers[j.ID]; b != nil && b.Alive && b.Epoch == j.Epoch && slices.Contains(s.Replicas, j.ID) && !s.InISR(j.ID) {
			isr = append(isr, j)
			added = append(added, j.ID)
			changed = true
		}
	}
	if !changed {
		return AlterISR{}, nil, false
	}
	return AlterISR{Name: name, Leader: self, LeaderEpoch: s.LeaderEpoch, Version: s.Version, ISR: isr}, added, true
}
