package cluster

import (
	"context"
	"log/slog"
	"time"

	"github.com/peatmq/peat/cluster/rules"
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
// the replicas it adds (rules.ProposeISR on this node's state and the
// Leader's tracker).
func (r *Replicator) proposeISR(ro *role, name string) (rules.AlterISR, []string, bool) {
	st := r.cfg.Node.View()
	s := st.Streams[name]
	if s == nil || s.Leader != r.cfg.Node.ID() || s.LeaderEpoch != ro.epoch {
		return rules.AlterISR{}, nil, false // the state moved on; sync replaces this role
	}
	return rules.ProposeISR(st, name, r.cfg.Node.ID(), ro.epoch, ro.l.Laggards(time.Now(), r.cfg.LagMax), ro.l.Joiners())
}
