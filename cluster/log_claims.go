package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/peatmq/peat/cluster/wire"
)

// Claims.
//
// A group's single consumer is decided by the stream's leader for every
// node, and kept as the group coordinator of Kafka keeps its groups: in
// the stream's replicated state (Kafka's __consumer_offsets holds group
// metadata beside the offsets), so the coordinator's successor, which
// comes from the ISR, knows every group's member without asking anyone.
//
//   - A follower's Claim and Unclaim are forwarded (ClaimRequest); a
//     leader that cannot be reached grants nothing and names no holder.
//     One still unanswered when the state names another leader (the
//     old one cut off with it on the way), or refused by a leader that
//     knew of its successor before this node did, is sent to the new
//     one (stream.whileLeads, movedOn), which waits for its own state
//     to name it if the follower's got there first (stream.leaderIn).
//   - The leader decides one claim at a time from the claim its state
//     holds under "\x00c/<key>" (hidden from mqtt's LoadState, refused in
//     its WriteState): version 1 | broker epoch 8 BE | node length uvarint
//     | node | holder. A claim is a state write answered once every ISR
//     member holds it, under acks=leader too (the one-consumer rule is
//     worth a round trip; only acks=all refuses below
//     min_insync_replicas). So a claim waits, as an acks=all publish
//     does, while a dead follower is still in the ISR. A claim the ISR
//     did not acknowledge is refused and taken back on the leader.
//   - A claim names the client, its node and that node's broker epoch;
//     the leader treats it as free once the controller's state has that
//     node failed or in another epoch. That is the lease: Kafka's
//     coordinator expires a member that stops heartbeating, and here the
//     node's liveness, which Serf and the controller already track and
//     fence, stands for its clients (their connections end with it). A
//     per-claim lease would add a write per renewal to an SD card and
//     one more timeout to tune, for nothing Serf does not already see.
//     A release names the node too, so a late release from a client's old
//     connection does not free the claim it made since on another node.
//   - A release that cannot reach the leader is kept and sent again
//     (200 ms backoff up to 2 s) until a leader has it; a Claim of the
//     same key from the same node sends it first. Every 5 s each node
//     also looks in its replica's state for claims naming its clients in
//     its epoch that it did not grant, or let go (a claim written but
//     whose answer was lost, a release lost with a leader), and releases
//     them (claims.repair). Claims of gone nodes stay in the state until
//     the key is claimed again: at most one per group and stream. (The
//     sessions' claims are adopted instead: log_sessions_orphaned.go.)
//
// There is no re-assertion to a new leader: it held every answered claim
// already. An unclean election (a leader from outside the ISR) can lose
// claims as it loses records. Claims hold while a partition separates a
// holder from the leader but not from the controller: the holder's node
// is alive, so its client keeps the group, as Kafka's member keeps its
// partitions until its session times out.

const (
	// claimStatePrefix starts every claim's key in the stream's state.
	// mqtt's keys are printable ("g/", "s/", "t/"): a NUL keeps the two
	// apart, and LoadState and WriteState hide and refuse it.
	claimStatePrefix = "\x00c/"
	// claimRepairInterval is how often a node looks for claims the state
	// gives its clients that they do not hold (claims.repair).
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

// claims are a stream's claims as this node sees them: those granted to
// its clients, the releases the leader has not had yet, and, while it
// leads the stream, the decisions for every node. Lock order: op, dec,
// mu; dec before the stream's state locks (a decision writes the
// state); mu is taken alone.
type claims struct {
	s *stream // where the claims live: its replicated state, its leader

	// op makes this node's claims and releases of the stream one at a
	// time, each until the leader answered; dec, the leader's decisions.
	op  sync.Mutex
	dec sync.Mutex
	mu  struct {
		sync.Mutex
		// granted are the claims this node's clients were granted (key
		// -> holder); releasing, their releases the leader has not had
		// yet.
		granted   map[string]string
		releasing map[claimRef]struct{}
	}
	rpc  rpcConn       // forwarded claims: not queued behind a state write's ISR wait
	kick chan struct{} // cap 1: a release is to be retried
	done chan struct{} // repair ended
}

func newClaims(s *stream) *claims {
	c := &claims{s: s, kick: make(chan struct{}, 1), done: make(chan struct{})}
	c.mu.granted = map[string]string{}
	c.mu.releasing = map[claimRef]struct{}{}
	return c
}

// Claim is decided by the stream's leader for every node (claims.claim).
func (s *stream) Claim(key, holder string) (ok bool, current string) {
	return s.claims.claim(key, holder)
}

// Unclaim gives key up if holder holds it (claims.unclaim).
func (s *stream) Unclaim(key, holder string) { s.claims.unclaim(key, holder) }

// load reads key's claim from this replica's state.
func (c *claims) load(key string) (h claimHolder, ok bool, err error) {
	k := claimStateKey(key)
	err = c.s.st.LoadState(k, func(got string, v []byte) error {
		if got != k {
			return nil
		}
		var derr error
		h, derr = decodeClaim(v)
		ok = derr == nil
		return derr
	})
	if err != nil {
		return claimHolder{}, false, fmt.Errorf("cluster: claim %q in %s: %w", key, c.s.name, err)
	}
	return h, ok, nil
}

func (c *claims) holderGone(h claimHolder) bool {
	b := c.s.l.node.View().Brokers[h.node]
	return b == nil || !b.Alive || b.Epoch != h.epoch
}

// onLeader decides a claim (or release) on the leader ld, one at a
// time: from the claim its state holds, written and answered once the
// ISR holds the change, so whoever the controller elects next holds every
// claim answered. A claim not answered is taken back here; a replica
// that has it already is put right by the holder's node (claims.repair).
func (c *claims) onLeader(ctx context.Context, ld *Leader, key string, h claimHolder, release bool) (ok bool, current string, err error) {
	c.dec.Lock()
	defer c.dec.Unlock()
	cur, held, err := c.load(key)
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
		if err := c.s.rs.write(ctx, ld, nil, []string{k}, waitISR); err != nil {
			return false, "", err
		}
		return true, "", nil
	}
	if held && cur.holder != h.holder && !c.holderGone(cur) {
		return false, cur.holder, nil
	}
	if err := c.put(ctx, ld, key, cur, held, h); err != nil {
		return false, "", err
	}
	return true, h.holder, nil
}

// put writes h as key's claim on the leader ld, whose state had cur
// (if held), and answers once the ISR holds it; one the ISR did not
// acknowledge is taken back. dec is held.
func (c *claims) put(ctx context.Context, ld *Leader, key string, cur claimHolder, held bool, h claimHolder) error {
	k := claimStateKey(key)
	if err := c.s.rs.write(ctx, ld, map[string][]byte{k: h.encode()}, nil, waitISR); err != nil {
		var puts map[string][]byte
		var dels []string
		if held {
			puts = map[string][]byte{k: cur.encode()}
		} else {
			dels = []string{k}
		}
		if rerr := c.s.rs.write(context.Background(), ld, puts, dels, waitNone); rerr != nil {
			c.s.l.log.Debug("cluster: taking back an unanswered claim", slog.String("stream", c.s.name), slog.String("key", key), slog.Any("err", rerr))
		}
		return err
	}
	c.moved(map[string][]byte{k: h.encode()}, nil)
	return nil
}

// decide has the stream's leader decide a claim of this node's
// holder: here when this node leads the stream, else forwarded, and
// forwarded again when the stream moves to another leader before the
// first answered (stream.whileLeads).
func (c *claims) decide(ctx context.Context, key, holder string, release bool) (ok bool, current string, err error) {
	h := claimHolder{holder: holder, node: c.s.l.node.ID(), epoch: c.s.l.node.Epoch()}
	for {
		if ld := c.s.noteLeader(); ld != nil {
			return c.onLeader(ctx, ld, key, h, release)
		}
		ok, current, err = c.forward(ctx, key, h, release)
		if err != errLeaderMoved {
			return ok, current, err
		}
		c.s.l.log.Debug("cluster: claim sent again to the stream's new leader", slog.String("stream", c.s.name), slog.String("key", key))
		c.s.awaitLeading(ctx)
	}
}

// forward sends a claim (or release) of h to the stream's leader;
// errLeaderMoved as stream.callLeader gives it.
func (c *claims) forward(ctx context.Context, key string, h claimHolder, release bool) (ok bool, current string, err error) {
	to, err := c.s.forwardTo("claim in")
	if err != nil {
		return false, "", err
	}
	req := wire.ClaimRequest{Stream: c.s.name, LeaderEpoch: to.epoch, Key: key, Holder: h.holder, Node: h.node, BrokerEpoch: h.epoch, Release: release}
	var resp wire.ClaimResponse
	if err := c.s.callLeader(ctx, &c.rpc, "claim in", to, wire.KindClaimRequest, req.AppendTo(nil),
		wire.KindClaimResponse, &resp, func() wire.Code { return resp.Code }); err != nil {
		return false, "", err
	}
	if err := codeErr("claim in", c.s.name, resp.Code, ""); err != nil {
		return false, "", err
	}
	return resp.OK, resp.Current, nil
}

// ctx bounds one decision by d and by the stream's close.
func (c *claims) ctx(d time.Duration) (context.Context, context.CancelFunc) {
	return c.ctxFrom(context.Background(), d)
}

// ctxFrom is ctx bounded by parent as well.
func (c *claims) ctxFrom(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, d)
	go func() {
		select {
		case <-c.s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// claim is decided by the stream's leader for every node (onLeader):
// here when this node leads it, else forwarded. A node that cannot reach
// a leader, or whose claim the ISR did not acknowledge, grants nothing
// and names no holder. This node's releases of key that have not reached
// the leader yet go first, so that a holder let go here does not refuse
// the next one.
func (c *claims) claim(key, holder string) (ok bool, current string) {
	c.op.Lock()
	defer c.op.Unlock()
	if c.s.closedErr("claim in") != nil {
		return false, ""
	}
	ctx, cancel := c.ctx(rpcTimeout)
	defer cancel()
	c.mu.Lock()
	var first []claimRef
	for r := range c.mu.releasing {
		if r.key == key && r.holder != holder {
			first = append(first, r)
		}
	}
	c.mu.Unlock()
	for _, r := range first {
		if _, _, err := c.decide(ctx, r.key, r.holder, true); err != nil {
			c.s.l.log.Info("cluster: claim not decided", slog.String("stream", c.s.name), slog.String("key", key), slog.Any("err", err))
			return false, ""
		}
		c.mu.Lock()
		delete(c.mu.releasing, r)
		c.mu.Unlock()
	}
	ok, current, err := c.decide(ctx, key, holder, false)
	if err != nil {
		c.s.l.log.Info("cluster: claim not decided", slog.String("stream", c.s.name), slog.String("key", key), slog.Any("err", err))
		return false, ""
	}
	if ok {
		c.granted(key, holder)
	}
	return ok, current
}

// granted records that the leader granted key to holder, this node's
// client: a release of it still on its way is moot.
func (c *claims) granted(key, holder string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.granted[key] = holder
	delete(c.mu.releasing, claimRef{key, holder})
}

// unclaim gives key up if holder holds it, on the leader. A release that
// does not reach the leader is retried until it does (claims.repair): a
// consumer that left must not hold its group while its node lives.
func (c *claims) unclaim(key, holder string) {
	c.op.Lock()
	defer c.op.Unlock()
	c.mu.Lock()
	if c.mu.granted[key] == holder {
		delete(c.mu.granted, key)
	}
	c.mu.Unlock()
	if c.s.closedErr("unclaim in") != nil {
		return
	}
	ctx, cancel := c.ctx(rpcTimeout)
	defer cancel()
	if _, _, err := c.decide(ctx, key, holder, true); err != nil {
		c.s.l.log.Info("cluster: release not decided yet, retrying", slog.String("stream", c.s.name), slog.String("key", key), slog.Any("err", err))
		c.mu.Lock()
		c.mu.releasing[claimRef{key, holder}] = struct{}{}
		c.mu.Unlock()
		signal(c.kick)
	}
}

// serve is the leader's side of a forwarded claim.
func (c *claims) serve(req *wire.ClaimRequest) wire.ClaimResponse {
	ctx, cancel := c.ctx(rpcTimeout - time.Second) // answered before the follower gives up
	defer cancel()
	ld := c.s.leaderIn(ctx, req.LeaderEpoch)
	if ld == nil {
		return wire.ClaimResponse{Code: wire.NotLeader}
	}
	ok, cur, err := c.onLeader(ctx, ld, req.Key, claimHolder{holder: req.Holder, node: req.Node, epoch: req.BrokerEpoch}, req.Release)
	if err != nil {
		return wire.ClaimResponse{Code: produceCode(err)}
	}
	return wire.ClaimResponse{OK: ok, Current: cur}
}

// repair runs until the stream closes. It sends the releases that
// did not reach the leader again, with a backoff, and every
// claimRepairInterval it looks in this replica's state for claims naming
// a client of this node, in its broker epoch, that this node did not
// grant or has let go (a claim the leader wrote but whose answer was
// lost, or a release lost with a leader), and releases them too.
func (c *claims) repair() {
	defer close(c.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.s.stop:
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
		if c.release(ctx, scan) {
			wait = min(wait, retry)
			retry = min(2*retry, claimRetryMax)
		} else {
			retry = claimRetryMin
		}
		t := time.NewTimer(wait)
		select {
		case <-c.s.stop:
			t.Stop()
			return
		case <-c.kick:
		case <-t.C:
		}
		t.Stop()
	}
}

// release makes one pass of repair (scan: looking in the
// state too) and reports whether releases are still to be sent.
func (c *claims) release(ctx context.Context, scan bool) bool {
	c.op.Lock()
	defer c.op.Unlock()
	if scan {
		var found []claimRef
		me, epoch := c.s.l.node.ID(), c.s.l.node.Epoch()
		_ = c.s.st.LoadState(claimStatePrefix, func(k string, v []byte) error {
			if h, err := decodeClaim(v); err == nil && h.node == me && h.epoch == epoch {
				found = append(found, claimRef{key: strings.TrimPrefix(k, claimStatePrefix), holder: h.holder})
			}
			return nil
		})
		c.mu.Lock()
		for _, r := range found {
			if c.mu.granted[r.key] != r.holder {
				c.mu.releasing[r] = struct{}{}
			}
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	refs := make([]claimRef, 0, len(c.mu.releasing))
	for r := range c.mu.releasing {
		refs = append(refs, r)
	}
	c.mu.Unlock()
	for _, r := range refs {
		if ctx.Err() != nil {
			return true
		}
		if _, _, err := c.decide(ctx, r.key, r.holder, true); err != nil {
			// The next would most likely fail alike: a Claim waiting for
			// op should not wait for all of them.
			c.s.l.log.Debug("cluster: release not decided", slog.String("stream", c.s.name), slog.String("key", r.key), slog.Any("err", err))
			return true
		}
		c.mu.Lock()
		delete(c.mu.releasing, r)
		c.mu.Unlock()
	}
	return false
}
