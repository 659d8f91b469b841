package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/mqtt"
)

// Claims (doc.go, "Claims"): a group's single consumer, decided by the
// stream's leader and kept in the stream's replicated state.
const (
	// claimStatePrefix starts every claim's key in the stream's state.
	// mqtt's keys are printable ("g/", "s/", "t/"): a NUL keeps the two
	// apart, and LoadState and WriteState hide and refuse it.
	claimStatePrefix = "\x00c/"
	// claimRepairInterval is how often a node looks for claims the state
	// gives its clients that they do not hold (repairClaims).
	claimRepairInterval = 5 * time.Second
	// claimRetryMin and claimRetryMax bound the backoff of a release that
	// did not reach the leader.
	claimRetryMin = 200 * time.Millisecond
	claimRetryMax = 2 * time.Second
	// claimVersion is the first byte of a claim's value.
	claimVersion = 1
)

func claimStateKey(key string) string { return claimStatePrefix + key }

// claimHolder is a claim's holder: a client of node in broker epoch.
// A holder whose node the state has failed, or restarted (another
// epoch), holds nothing: its client is gone.
type claimHolder struct {
	holder string
	node   string
	epoch  uint64
}

// encode is the claim's value in the state:
// version 1 | broker epoch 8 BE | node length uvarint | node | holder.
func (h claimHolder) encode() []byte {
	b := append(make([]byte, 0, 1+8+1+len(h.node)+len(h.holder)), claimVersion)
	b = binary.BigEndian.AppendUint64(b, h.epoch)
	b = binary.AppendUvarint(b, uint64(len(h.node)))
	b = append(b, h.node...)
	return append(b, h.holder...)
}

var errBadClaim = errors.New("cluster: malformed claim in the stream's state")

func decodeClaim(b []byte) (claimHolder, error) {
	if len(b) < 1+8 || b[0] != claimVersion {
		return claimHolder{}, errBadClaim
	}
	h := claimHolder{epoch: binary.BigEndian.Uint64(b[1:9])}
	n, w := binary.Uvarint(b[9:])
	if w <= 0 || n > uint64(len(b)-9-w) {
		return claimHolder{}, errBadClaim
	}
	rest := b[9+w:]
	h.node, h.holder = string(rest[:n]), string(rest[n:])
	return h, nil
}

// claimRef is one holder of this node letting key go.
type claimRef struct{ key, holder string }

// loadClaim reads key's claim from this replica's state.
func (s *stream) loadClaim(key string) (h claimHolder, ok bool, err error) {
	k := claimStateKey(key)
	err = s.st.LoadState(k, func(got string, v []byte) error {
		if got != k {
			return nil
		}
		var derr error
		h, derr = decodeClaim(v)
		ok = derr == nil
		return derr
	})
	if err != nil {
		return claimHolder{}, false, fmt.Errorf("cluster: claim %q in %s: %w", key, s.name, err)
	}
	return h, ok, nil
}

func (s *stream) holderGone(h claimHolder) bool {
	b := s.l.node.View().Brokers[h.node]
	return b == nil || !b.Alive || b.Epoch != h.epoch
}

// claimOnLeader decides a claim (or release) on the leader ld, one at a
// time: from the claim its state holds, written and answered once the
// ISR holds the change, so whoever the controller elects next holds every
// claim answered. A claim not answered is taken back here; a replica
// that has it already is put right by the holder's node (repairClaims).
func (s *stream) claimOnLeader(ctx context.Context, ld *Leader, key string, h claimHolder, release bool) (ok bool, current string, err error) {
	s.claimDec.Lock()
	defer s.claimDec.Unlock()
	cur, held, err := s.loadClaim(key)
	if err != nil {
		return false, "", err
	}
	k := claimStateKey(key)
	if release {
		// Only the node that claimed for holder releases it: a client that
		// moved to another node and claimed there keeps its new claim when
		// its old connection's release arrives late.
		if !held || cur.holder != h.holder || cur.node != h.node {
			return true, "", nil
		}
		if err := s.writeState(ctx, ld, nil, []string{k}, waitISR); err != nil {
			return false, "", err
		}
		return true, "", nil
	}
	if held && cur.holder != h.holder && !s.holderGone(cur) {
		return false, cur.holder, nil
	}
	if err := s.putClaim(ctx, ld, key, cur, held, h); err != nil {
		return false, "", err
	}
	return true, h.holder, nil
}

// putClaim writes h as key's claim on the leader ld, whose state had cur
// (if held), and answers once the ISR holds it; one the ISR did not
// acknowledge is taken back. claimDec is held.
func (s *stream) putClaim(ctx context.Context, ld *Leader, key string, cur claimHolder, held bool, h claimHolder) error {
	k := claimStateKey(key)
	if err := s.writeState(ctx, ld, map[string][]byte{k: h.encode()}, nil, waitISR); err != nil {
		var puts map[string][]byte
		var dels []string
		if held {
			puts = map[string][]byte{k: cur.encode()}
		} else {
			dels = []string{k}
		}
		if rerr := s.writeState(context.Background(), ld, puts, dels, waitNone); rerr != nil {
			s.l.log.Debug("cluster: taking back an unanswered claim", slog.String("stream", s.name), slog.String("key", key), slog.Any("err", rerr))
		}
		return err
	}
	s.claimsMoved(map[string][]byte{k: h.encode()}, nil)
	return nil
}

// decideClaim has the stream's leader decide a claim of this node's
// holder: here when this node leads the stream, else forwarded.
func (s *stream) decideClaim(ctx context.Context, key, holder string, release bool) (ok bool, current string, err error) {
	h := claimHolder{holder: holder, node: s.l.node.ID(), epoch: s.l.node.Epoch()}
	if ld := s.noteLeader(); ld != nil {
		return s.claimOnLeader(ctx, ld, key, h, release)
	}
	leader, epoch, addr := s.stateLeader()
	if leader == "" || leader == s.l.node.ID() || addr == "" {
		return false, "", fmt.Errorf("cluster: claim in %s: no leader known: %w", s.name, mqtt.ErrLeaderUnavailable)
	}
	req := wire.ClaimRequest{Stream: s.name, LeaderEpoch: epoch, Key: key, Holder: holder, Node: h.node, BrokerEpoch: h.epoch, Release: release}
	var resp wire.ClaimResponse
	if err := s.claimRPC.call(ctx, s.l.node.dialer(), addr, wire.KindClaimRequest, req.AppendTo(nil), wire.KindClaimResponse, &resp); err != nil {
		return false, "", fmt.Errorf("cluster: claim in %s through %s: %v: %w", s.name, leader, err, mqtt.ErrLeaderUnavailable)
	}
	if err := codeErr("claim in", s.name, resp.Code, ""); err != nil {
		return false, "", err
	}
	return resp.OK, resp.Current, nil
}

// claimCtx bounds one decision by d and by the stream's close.
func (s *stream) claimCtx(d time.Duration) (context.Context, context.CancelFunc) {
	return s.claimCtxFrom(context.Background(), d)
}

// claimCtxFrom is claimCtx bounded by parent as well.
func (s *stream) claimCtxFrom(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, d)
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Claim is decided by the stream's leader for every node (claimOnLeader):
// here when this node leads it, else forwarded. A node that cannot reach
// a leader, or whose claim the ISR did not acknowledge, grants nothing
// and names no holder. This node's releases of key that have not reached
// the leader yet go first, so that a holder let go here does not refuse
// the next one.
func (s *stream) Claim(key, holder string) (ok bool, current string) {
	s.claimOp.Lock()
	defer s.claimOp.Unlock()
	if s.closedErr("claim in") != nil {
		return false, ""
	}
	ctx, cancel := s.claimCtx(rpcTimeout)
	defer cancel()
	s.mu.Lock()
	var first []claimRef
	for r := range s.mu.releasing {
		if r.key == key && r.holder != holder {
			first = append(first, r)
		}
	}
	s.mu.Unlock()
	for _, r := range first {
		if _, _, err := s.decideClaim(ctx, r.key, r.holder, true); err != nil {
			s.l.log.Info("cluster: claim not decided", slog.String("stream", s.name), slog.String("key", key), slog.Any("err", err))
			return false, ""
		}
		s.mu.Lock()
		delete(s.mu.releasing, r)
		s.mu.Unlock()
	}
	ok, current, err := s.decideClaim(ctx, key, holder, false)
	if err != nil {
		s.l.log.Info("cluster: claim not decided", slog.String("stream", s.name), slog.String("key", key), slog.Any("err", err))
		return false, ""
	}
	if ok {
		s.mu.Lock()
		s.mu.granted[key] = holder
		delete(s.mu.releasing, claimRef{key, holder})
		s.mu.Unlock()
	}
	return ok, current
}

// Unclaim gives key up if holder holds it, on the leader. A release that
// does not reach the leader is retried until it does (repairClaims): a
// consumer that left must not hold its group while its node lives.
func (s *stream) Unclaim(key, holder string) {
	s.claimOp.Lock()
	defer s.claimOp.Unlock()
	s.mu.Lock()
	if s.mu.granted[key] == holder {
		delete(s.mu.granted, key)
	}
	s.mu.Unlock()
	if s.closedErr("unclaim in") != nil {
		return
	}
	ctx, cancel := s.claimCtx(rpcTimeout)
	defer cancel()
	if _, _, err := s.decideClaim(ctx, key, holder, true); err != nil {
		s.l.log.Info("cluster: release not decided yet, retrying", slog.String("stream", s.name), slog.String("key", key), slog.Any("err", err))
		s.mu.Lock()
		s.mu.releasing[claimRef{key, holder}] = struct{}{}
		s.mu.Unlock()
		signal(s.claimKick)
	}
}

// serveClaim is the leader's side of a forwarded claim.
func (s *stream) serveClaim(req *wire.ClaimRequest) wire.ClaimResponse {
	ld := s.noteLeader()
	if ld == nil || ld.epoch != req.LeaderEpoch {
		return wire.ClaimResponse{Code: wire.NotLeader}
	}
	ctx, cancel := s.claimCtx(rpcTimeout - time.Second) // answered before the follower gives up
	defer cancel()
	ok, cur, err := s.claimOnLeader(ctx, ld, req.Key, claimHolder{holder: req.Holder, node: req.Node, epoch: req.BrokerEpoch}, req.Release)
	if err != nil {
		return wire.ClaimResponse{Code: produceCode(err)}
	}
	return wire.ClaimResponse{OK: ok, Current: cur}
}

// repairClaims runs until the stream closes. It sends the releases that
// did not reach the leader again, with a backoff, and every
// claimRepairInterval it looks in this replica's state for claims naming
// a client of this node, in its broker epoch, that this node did not
// grant or has let go (a claim the leader wrote but whose answer was
// lost, or a release lost with a leader), and releases them too.
func (s *stream) repairClaims() {
	defer close(s.repairDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	retry := claimRetryMin
	next := time.Now().Add(claimRepairInterval)
	for {
		scan := !time.Now().Before(next)
		if scan {
			next = time.Now().Add(claimRepairInterval)
		}
		wait := time.Until(next)
		if s.releaseClaims(ctx, scan) {
			wait = min(wait, retry)
			retry = min(2*retry, claimRetryMax)
		} else {
			retry = claimRetryMin
		}
		t := time.NewTimer(wait)
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-s.claimKick:
		case <-t.C:
		}
		t.Stop()
	}
}

// releaseClaims makes one pass of repairClaims (scan: looking in the
// state too) and reports whether releases are still to be sent.
func (s *stream) releaseClaims(ctx context.Context, scan bool) bool {
	s.claimOp.Lock()
	defer s.claimOp.Unlock()
	if scan {
		var found []claimRef
		me, epoch := s.l.node.ID(), s.l.node.Epoch()
		_ = s.st.LoadState(claimStatePrefix, func(k string, v []byte) error {
			if h, err := decodeClaim(v); err == nil && h.node == me && h.epoch == epoch {
				found = append(found, claimRef{key: strings.TrimPrefix(k, claimStatePrefix), holder: h.holder})
			}
			return nil
		})
		s.mu.Lock()
		for _, r := range found {
			if s.mu.granted[r.key] != r.holder {
				s.mu.releasing[r] = struct{}{}
			}
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	refs := make([]claimRef, 0, len(s.mu.releasing))
	for r := range s.mu.releasing {
		refs = append(refs, r)
	}
	s.mu.Unlock()
	for _, r := range refs {
		if ctx.Err() != nil {
			return true
		}
		if _, _, err := s.decideClaim(ctx, r.key, r.holder, true); err != nil {
			// The next would most likely fail alike: a Claim waiting for
			// claimOp should not wait for all of them.
			s.l.log.Debug("cluster: release not decided", slog.String("stream", s.name), slog.String("key", r.key), slog.Any("err", err))
			return true
		}
		s.mu.Lock()
		delete(s.mu.releasing, r)
		s.mu.Unlock()
	}
	return false
}
