package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Forwarded consumer state: a follower's state write (and, through the
// same helpers, its claims: log_claims.go) goes to the stream's leader,
// and follows the stream when the leader changes before it answered.
//
//   - callLeader ends the call once this node's state names another
//     leader or epoch (whileLeads: the old leader cut off with the call
//     on its way), or, when a deposed leader answered "not the leader",
//     once this node's state names its successor (movedOn); the caller
//     then sends it to the new leader.
//   - A node the state has just named leader holds a call forwarded in
//     an epoch it has not learnt yet, or before its Replicator leads,
//     for up to leaderStartWait (leaderIn), as it holds appends
//     (admitOrHoldLocked in log_stream.go).

// errLeaderMoved ends a call to a stream's leader once this node's copy
// of the controller's state names another (whileLeads); the caller sends
// it to the new one.
var errLeaderMoved = errors.New("cluster: the stream's leader moved")

// whileLeads is ctx, ended with the cause errLeaderMoved once this node's
// copy of the controller's state no longer names leader in epoch for the
// stream. A leader cut off in the middle of a forwarded state write or
// claim never answers it (the request and its answer go into the cut),
// while the controller fences it and moves the stream within the
// session timeout: the call is then better sent to the next leader than
// waited out for rpcTimeout. Puts, deletes and claims are idempotent (a
// claim of the same holder is granted again), so one sent twice changes
// nothing more than once, and the new leader, elected from the ISR,
// holds whatever the old one had committed.
func (s *stream) whileLeads(ctx context.Context, leader string, epoch uint32) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		for {
			_, changed := s.l.node.Watch() // before looking: a change from now on closes it
			if id, e := s.stateLeaderID(); id != leader || e != epoch {
				cancel(errLeaderMoved)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// movedOn waits up to leaderStartWait for ctx, a whileLeads, to end
// with errLeaderMoved: a leader that answered "not the leader" has been
// deposed, and this node's state names its successor a moment later
// (the controller's entry reached the old leader first). The call was
// not applied, so it is sent to the successor.
func movedOn(ctx context.Context) bool {
	t := time.NewTimer(leaderStartWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx) == errLeaderMoved
	case <-t.C:
		return false
	}
}

// awaitLeading waits, when this node's copy of the controller's state
// names it the stream's leader, until its Replicator leads the stream
// (leaderIn): a write or claim that followed the stream here is then
// decided here, not refused for want of a leader in between.
func (s *stream) awaitLeading(ctx context.Context) {
	if id, epoch := s.stateLeaderID(); id == s.l.node.ID() {
		s.leaderIn(ctx, epoch)
	}
}

// leaderIn is this node's Leader of the stream in epoch, waited for up
// to leaderStartWait while no Leader runs here and the state here names
// this node or is older than epoch (awaitsLeadership): a follower whose
// state ran ahead of this node's forwards in an epoch this node learns
// of a moment later. nil when it does not come.
func (s *stream) leaderIn(ctx context.Context, epoch uint32) *Leader {
	deadline := time.NewTimer(leaderStartWait)
	defer deadline.Stop()
	for {
		_, leading := s.l.rep.Leading(s.name) // before looking: a change from now on closes it
		_, changed := s.l.node.Watch()
		if ld := s.noteLeader(); ld != nil {
			if ld.epoch != epoch {
				return nil
			}
			return ld
		}
		if !s.awaitsLeadership(epoch) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-deadline.C:
			return nil
		case <-leading:
		case <-changed:
		}
	}
}

// leaderAt is the leader a follower's call goes to, as this node's copy
// of the controller's state names it.
type leaderAt struct {
	id    string
	epoch uint32
	addr  string
}

// forwardTo is the leader what ("write state of", "claim in") is
// forwarded to; ErrLeaderUnavailable while the state names none, or
// names this node (whose Leader has not started).
func (s *stream) forwardTo(what string) (leaderAt, error) {
	id, epoch, addr := s.stateLeader()
	if id == "" || id == s.l.node.ID() || addr == "" {
		return leaderAt{}, fmt.Errorf("cluster: %s %s: no leader known: %w", what, s.name, mqtt.ErrLeaderUnavailable)
	}
	return leaderAt{id, epoch, addr}, nil
}

// callLeader makes one forwarded call to the leader to on c, and reads
// its answer into resp (code reads the answer's code). It gives
// errLeaderMoved when the stream's leader changed before the answer
// (whileLeads), or the answer was "not the leader" and this node's state
// then moved on (movedOn): the caller sends the call to the new leader.
func (s *stream) callLeader(ctx context.Context, c *rpcConn, what string, to leaderAt,
	kind byte, body []byte, want byte, resp decoder, code func() wire.Code) error {
	ctx, cancel := s.whileLeads(ctx, to.id, to.epoch)
	defer cancel()
	if err := c.call(ctx, s.l.node.dialer(), to.addr, kind, body, want, resp); err != nil {
		if context.Cause(ctx) == errLeaderMoved {
			return errLeaderMoved
		}
		return fmt.Errorf("cluster: %s %s through %s: %v: %w", what, s.name, to.id, err, mqtt.ErrLeaderUnavailable)
	}
	if code() == wire.NotLeader && movedOn(ctx) {
		return errLeaderMoved
	}
	return nil
}

// forwardStateWrite passes a follower's state write to the leader,
// naming this node when the leader fences it (fromFor); errLeaderMoved
// as callLeader gives it.
func (s *stream) forwardStateWrite(ctx context.Context, puts map[string][]byte, dels []string) error {
	to, err := s.forwardTo("write state of")
	if err != nil {
		return err
	}
	if n := len(puts) + len(dels); n > logstore.MaxStateWrite {
		return fmt.Errorf("cluster: write state of %s: %d entries, at most %d", s.name, n, logstore.MaxStateWrite)
	}
	from := s.fromFor(to.id)
	req := wire.StateWriteRequest{Stream: s.name, LeaderEpoch: to.epoch, Dels: dels, Node: from.node, BrokerEpoch: from.epoch}
	for _, k := range slices.Sorted(maps.Keys(puts)) {
		req.Puts = append(req.Puts, wire.KV{Key: k, Val: puts[k]})
	}
	var resp wire.StateWriteResponse
	if err := s.callLeader(ctx, &s.rpc, "write state of", to, wire.KindStateWriteRequest, req.AppendTo(nil),
		wire.KindStateWriteResponse, &resp, func() wire.Code { return resp.Code }); err != nil {
		return err
	}
	if resp.Code == wire.NotHolder && len(resp.Moved) > 0 {
		return &movedError{keys: resp.Moved}
	}
	return codeErr("write state of", s.name, resp.Code, resp.Message)
}

// serveStateWrite is the leader's side of a forwarded state write.
func (s *stream) serveStateWrite(ctx context.Context, req *wire.StateWriteRequest) wire.StateWriteResponse {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout-time.Second) // answered before the follower gives up
	defer cancel()
	ld := s.leaderIn(ctx, req.LeaderEpoch)
	if ld == nil {
		return wire.StateWriteResponse{Code: wire.NotLeader}
	}
	puts := make(map[string][]byte, len(req.Puts))
	for _, kv := range req.Puts {
		puts[kv.Key] = kv.Val
	}
	if err := s.writeStateFrom(ctx, ld, puts, req.Dels, stateFrom{req.Node, req.BrokerEpoch}); err != nil {
		if moved, ok := errors.AsType[*movedError](err); ok {
			return wire.StateWriteResponse{Code: wire.NotHolder, Message: err.Error(), Moved: moved.keys}
		}
		return wire.StateWriteResponse{Code: produceCode(err), Message: err.Error()}
	}
	return wire.StateWriteResponse{}
}
