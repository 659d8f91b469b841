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

// Durable sessions across the site.
//
// A durable session is the site's: a client whose node died reconnects
// to any other and finds it. Its offsets are stream state, replicated
// with each stream; its properties and subscriptions are in the state of
// one more stream, SessionsStream ("_sessions"), which every node's Site
// creates with the configured ones, at the largest of their replication
// factors (nodes outside its replicas are observers, which fetch its
// state too; Status lists it last). It captures no topics: a mirror
// stream without filters in the store, which nothing routes to and which
// holds no records. The controller's
// state was not the place: Kafka keeps groups in __consumer_offsets, not
// in its metadata quorum, because the Raft log is applied by every node,
// snapshotted whole and on the path of every election, and per-client
// churn (every connect, subscribe and disconnect of a persistent client,
// thousands after a site's power cut) would slow down the decisions a
// failover waits for. The stream gets from what exists writes answered
// once its ISR holds them, a failover that keeps them, a copy on every
// node to read at connect, and claims.
//
// The Log keeps the stream out of Streams, Stream, Route and
// WatchStreams, and serves it to mqtt as mqtt.SiteSessions:
//
//   - SessionState is its state: writes through its leader, fenced there
//     by the sessions' claims (below), loads from this node's replica.
//   - ClaimSession claims the client id with the id itself as holder, so
//     the leader grants it whoever held it, naming this node: MQTT's one
//     connection per client id becomes the claim's move. The node that
//     held it sees its replica's claim name another node, or go
//     (claims.moved, on the leader as it decides and on a follower as it
//     applies fetched changes) and calls OnSessionTaken: mqtt there
//     closes the old connection and drops its later writes of the
//     session. An ISR member applies the move before the new claim is
//     answered (its acknowledgement is its next fetch); an observer a
//     fetch later. A site still forming, or whose sessions' leader is
//     failing over, is waited for up to 10 s (sessionClaimWait), trying
//     every 250 ms.
//   - ReleaseSession goes through the claims' retried releases
//     (claims.repair), without waiting.
//
// mqtt reads a session when its client connects (mqtt's sessions_site.go
// says how), not at start; the node holding the claim alone writes it.
// What a node's death can cost: up to mqtt's state interval (100 ms) of
// acknowledged progress, delivered again, and a subscription made in the
// same instant is held by the SUBACK until the site has it.
//
// Writes are fenced on the leader as well as on the writing node
// (writeStateFrom): a write of the sessions' state names its node and
// broker epoch (StateWriteRequest's optional fields), and the leader,
// under claims.dec, the lock claims are decided with, refuses it as a
// whole (NotHolder, naming the keys) when a session it touches is
// claimed by another node, by the writer's node in another epoch, or by
// no one. A session is claimed before its first write and released only
// once its deletion is written, so a write finding no claim is late too:
// the session was adopted and expired meanwhile (or its claim was lost,
// and its client claims it again at its next connect). Writes of the
// leader's own node are checked alike. The writing node drops those keys
// and writes the rest at once (sessionState.WriteState), as mqtt drops
// its own writes of a session it knows moved, and lets the session go
// once its replica shows the claim moved or deleted. So a write the old
// holder sent or queued before it applied the move never lands after
// it. The check reads each session's claim; claims.dec is let go once the
// write is in the leader's store, so writes wait for a claim being
// decided (its ISR round trip) but not for each other's acknowledgement.
//
// A session's offsets are in its streams' own state, whose leaders
// decide no claims; each fences them from its replica of the sessions'
// stream instead (unheld): a write of a stream's state names its
// node as well, and its leader refuses the keys of session offsets
// (mqtt.SessionOffsetClient) whose claim there does not name the writer,
// as above. Only a member of the sessions' ISR checks: the sessions'
// leader answers a claim once its ISR has applied it, so such a replica
// shows every claim a writer can hold, and a late write of the old holder
// either finds the move or landed before the new holder was answered (as
// if sent a moment earlier). An observer of the sessions' stream (a site
// of more than three nodes) leading a stream writes offsets unfenced, as
// all did before. Group offsets are no session's and are not fenced.
// A node's own sessions from before it joined a site are none of the
// site's, so the offsets of theirs that its start moves into streams
// (mqtt's migrateState) are dropped the same way.
//
// In a site of mixed versions, a 4-field StateWriteRequest (an older
// node's) names no node and is written unfenced, as before; a node names
// itself only to a leader whose Serf tags show its own Peat version,
// since an older leader drops the longer frame (and every session write
// with it until the upgrade ends). Writes then go unfenced, as they did,
// and an older node's late write of an expired session is adopted again
// (below).
//
// The streams' state is shared (mqtt.SharedState), so mqtt never takes
// another node's session offsets for leftovers.

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
	taken := takenBy(ld)                // outside claims.dec: Current takes the Node's locks
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
	return s.rs.await(ctx, ld, seq, waitAcks, taken)
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
