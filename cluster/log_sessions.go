package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Durable sessions across the site (doc.go, "Sessions across the site").
//
// SessionsStream is a stream of the controller's state like any other,
// with no topics: its records are none, its replicated consumer state
// holds every durable session's properties and subscriptions (mqtt's
// keys), and its claims, one per client id, say which node holds each
// session. The Log keeps it out of Streams, Route and Stream: mqtt sees
// it as SessionState.
const SessionsStream = "_sessions"

// sessionsStreamConfig is the store's stream behind SessionsStream: a
// mirror, so that it may have no filters (nothing routes to it); its
// durability concerns records it never gets, and an interval one is
// accepted whatever the store opened with.
func sessionsStreamConfig() logstore.StreamConfig {
	return logstore.StreamConfig{Name: SessionsStream, Mirror: true, Durability: logstore.DurabilityInterval, SyncInterval: sessionsSyncInterval}
}

// sessionsSyncInterval is long: the stream has no records to sync.
const sessionsSyncInterval = time.Hour

var _ mqtt.SiteSessions = (*Log)(nil)

// SessionState is the sessions' stream's state: written through its
// leader and answered once its ISR holds the write, read from this
// node's replica. Until the stream is served here writes are refused
// (mqtt.ErrLeaderUnavailable) and reads find nothing.
func (l *Log) SessionState() mqtt.StateStore { return sessionState{l} }

type sessionState struct{ l *Log }

// WriteState writes the sessions' state as stream.WriteState writes any
// stream's: what the leader refused because another node holds those
// sessions is dropped.
func (s sessionState) WriteState(puts map[string][]byte, dels []string) error {
	st := s.l.stream(SessionsStream)
	if st == nil {
		if s.l.isClosed() {
			return fmt.Errorf("cluster: write sessions: %w", logstore.ErrClosed)
		}
		return fmt.Errorf("cluster: write sessions: %s not served yet: %w", SessionsStream, mqtt.ErrLeaderUnavailable)
	}
	return st.WriteState(puts, dels)
}

// withoutKeys is puts and dels without keys, copied (the caller's are
// left alone).
func withoutKeys(puts map[string][]byte, dels []string, keys []string) (map[string][]byte, []string) {
	p := maps.Clone(puts)
	for _, k := range keys {
		delete(p, k)
	}
	d := slices.DeleteFunc(slices.Clone(dels), func(k string) bool { return slices.Contains(keys, k) })
	return p, d
}

// stateFrom names the node a state write comes from, in its broker
// epoch; zero for a write that names none (an older node's frame),
// which is written unfenced.
type stateFrom struct {
	node  string
	epoch uint64
}

// movedError refuses a state write as a whole: keys are those of
// sessions (in the sessions' stream, or their offsets in another) whose
// claim names another node, another epoch of the writer's, or no one.
type movedError struct{ keys []string }

func (e *movedError) Error() string {
	return fmt.Sprintf("cluster: state write: %d keys of sessions another node holds", len(e.keys))
}

// writeStateFrom is writeStateLeader for a write from node from. On the
// sessions' stream, a write naming its node is the fence of "Sessions
// across the site": refused (movedError) when a session it touches is
// not claimed by from (unheld), checked and written under claims.dec, the
// lock claims are decided with, so that no claim moves between the
// check and the write: a late write of a node that lost a session
// (taken over, or adopted by the leader and expired) cannot land after
// the move. The ISR's acknowledgement is waited for after claims.dec is
// let go. On another stream, its session offsets are fenced alike
// (unheld).
func (s *stream) writeStateFrom(ctx context.Context, ld *Leader, puts map[string][]byte, dels []string, from stateFrom) error {
	if from.node == "" {
		return s.writeStateLeader(ctx, ld, puts, dels)
	}
	decides := s.name == SessionsStream // claims are decided here, under claims.dec
	if decides {
		s.claims.dec.Lock()
	}
	moved, err := s.unheld(puts, dels, from)
	var seq uint64
	if err == nil && len(moved) == 0 {
		seq, err = s.rs.stage(ld, puts, dels, waitAcks)
	}
	if decides {
		s.claims.dec.Unlock()
	}
	switch {
	case err != nil:
		return err
	case len(moved) > 0:
		return &movedError{keys: moved}
	}
	return s.rs.await(ctx, ld, seq, waitAcks)
}

// unheldIn returns the keys of a write whose session's claim in claims
// (the sessions' stream) does not name from: another node's, from's
// node's in another epoch, or none. A session is claimed before its
// first write and released only after its deletion is written (its
// offsets' too), so a write finding no claim is late too: the session
// was adopted and expired meanwhile (or its claim was lost with the
// stream's data, and its client claims it again). clientOf maps a key to
// its session's client; other keys are not fenced.
func unheldIn(claims *claims, puts map[string][]byte, dels []string, from stateFrom, clientOf func(string) (string, bool)) ([]string, error) {
	keys := slices.AppendSeq(slices.Clone(dels), maps.Keys(puts))
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var moved []string
	for _, k := range keys {
		id, ok := clientOf(k)
		if !ok {
			continue
		}
		h, held, err := claims.load(id)
		if err != nil {
			return nil, err
		}
		if !held || h.node != from.node || h.epoch != from.epoch {
			moved = append(moved, k)
		}
	}
	return moved, nil
}

// unheld is unheldIn for a write of this stream's state: on the
// sessions' stream, its sessions' keys against its own claims (claims.dec
// held); on another, its session offsets against this node's replica of
// the sessions' stream. Only a member of that stream's ISR checks the
// latter: its leader answers a claim once the ISR has applied it, so
// such a replica shows every claim a writer can hold, and a late write
// either finds the move or landed before the new holder was answered
// (as if written a moment earlier). An observer's replica may not show
// a claim just answered yet: it writes unfenced, as a site of older
// nodes does.
func (s *stream) unheld(puts map[string][]byte, dels []string, from stateFrom) ([]string, error) {
	if s.name == SessionsStream {
		return unheldIn(s.claims, puts, dels, from, mqtt.SiteSessionClient)
	}
	claims := s.l.stream(SessionsStream)
	if claims == nil {
		return nil, nil
	}
	if cs := s.l.node.View().Streams[SessionsStream]; cs == nil || !cs.InISR(s.l.node.ID()) {
		return nil, nil
	}
	return unheldIn(claims.claims, puts, dels, from, mqtt.SessionOffsetClient)
}

// fromFor is what this node names itself as in a write of the stream's
// state forwarded to leader: itself, when leader runs this node's Peat
// version (its Serf tag). A leader of another version may predate the
// fence and would drop the longer frame, leaving state unwritten until a
// rolling upgrade ends: it gets the older frame, which it writes
// unfenced, as before.
func (s *stream) fromFor(leader string) stateFrom {
	n := s.l.node
	if m, ok := n.member(leader); ok && m.Tags[tagVersion] == n.cfg.Version {
		return stateFrom{n.ID(), n.Epoch()}
	}
	return stateFrom{}
}

func (s sessionState) LoadState(prefix string, fn func(key string, val []byte) error) error {
	st := s.l.stream(SessionsStream)
	if st == nil {
		if s.l.isClosed() {
			return fmt.Errorf("cluster: load sessions: %w", logstore.ErrClosed)
		}
		return nil
	}
	return st.LoadState(prefix, fn)
}

// ClaimSession makes this node the holder of client id's session: a
// claim on the id (log_claims.go) whose holder is the id itself, so the
// leader grants it whichever node held it, and that node, its replica
// of the state showing the claim moved, is told (OnSessionTaken). A
// site still forming, or whose sessions' leader is failing over, is
// waited for up to sessionClaimWait; false when no leader decided it by
// then.
func (l *Log) ClaimSession(id string) bool {
	deadline := time.Now().Add(sessionClaimWait)
	for {
		if s := l.stream(SessionsStream); s != nil {
			if ok, _ := s.Claim(id, id); ok {
				return true
			}
		}
		wait := time.Until(deadline)
		if wait <= 0 || l.isClosed() {
			return false
		}
		t := time.NewTimer(min(wait, sessionClaimRetry))
		select {
		case <-t.C:
		case <-l.stop:
		}
		t.Stop()
	}
}

// sessionClaimWait bounds how long a connecting client waits for a claim
// a site cannot decide yet; sessionClaimRetry paces the tries.
const (
	sessionClaimWait  = 10 * time.Second
	sessionClaimRetry = 250 * time.Millisecond
)

// ReleaseSession lets client id's session go; the release reaches the
// leader in the background, retried until it does (claims.repair).
func (l *Log) ReleaseSession(id string) {
	if st := l.stream(SessionsStream); st != nil {
		st.claims.releaseLater(id, id)
	}
}

// OnSessionTaken sets fn (nil: none), called with the client id of each
// session this node was granted whose claim its replica of the state now
// gives to another node (or to this node in an older epoch).
func (l *Log) OnSessionTaken(fn func(id string)) {
	if fn == nil {
		l.taken.Store(nil)
		return
	}
	l.taken.Store(&fn)
}

// moved looks, on the sessions' stream, at claims just written to
// this replica (a leader's decision, or a follower's fetched changes) for
// those granted here that now name another holder's node, or that went
// (deleted: this node's own releases are no longer granted when they
// go): the session was taken over elsewhere, or adopted and expired, and
// this node lets it go.
func (c *claims) moved(puts map[string][]byte, dels []string) {
	if c.s.name != SessionsStream {
		return
	}
	me, epoch := c.s.l.node.ID(), c.s.l.node.Epoch()
	var lost []string
	c.mu.Lock()
	take := func(k string, moved func() bool) {
		key, ok := strings.CutPrefix(k, claimStatePrefix)
		if !ok {
			return
		}
		if holder, granted := c.mu.granted[key]; granted && moved() {
			delete(c.mu.granted, key)
			lost = append(lost, holder)
		}
	}
	for k, v := range puts {
		take(k, func() bool {
			h, err := decodeClaim(v)
			return err == nil && (h.node != me || h.epoch != epoch)
		})
	}
	for _, k := range dels {
		take(k, func() bool { return true })
	}
	c.mu.Unlock()
	if fn := c.s.l.taken.Load(); fn != nil {
		for _, id := range lost {
			(*fn)(id)
		}
	}
}

// releaseLater is Unclaim without waiting for the leader: repair
// sends it (a Claim of key by this node first drops it).
func (c *claims) releaseLater(key, holder string) {
	c.mu.Lock()
	if c.mu.granted[key] == holder {
		delete(c.mu.granted, key)
	}
	c.mu.releasing[claimRef{key, holder}] = struct{}{}
	c.mu.Unlock()
	signal(c.kick)
}
