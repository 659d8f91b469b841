package cluster

import (
	"fmt"
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
// leader in the background, retried until it does (repairClaims).
func (l *Log) ReleaseSession(id string) {
	if st := l.stream(SessionsStream); st != nil {
		st.releaseLater(id, id)
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

// claimsMoved looks, on the sessions' stream, at claims just written to
// this replica (a leader's decision, or a follower's fetched changes) for
// those granted here that now name another holder's node: the session
// was taken over elsewhere, and this node lets it go.
func (s *stream) claimsMoved(puts map[string][]byte) {
	if s.name != SessionsStream {
		return
	}
	me, epoch := s.l.node.ID(), s.l.node.Epoch()
	var lost []string
	s.mu.Lock()
	for k, v := range puts {
		key, ok := strings.CutPrefix(k, claimStatePrefix)
		if !ok {
			continue
		}
		holder, granted := s.mu.granted[key]
		if !granted {
			continue
		}
		if h, err := decodeClaim(v); err != nil || h.node == me && h.epoch == epoch {
			continue
		}
		delete(s.mu.granted, key)
		lost = append(lost, holder)
	}
	s.mu.Unlock()
	if fn := s.l.taken.Load(); fn != nil {
		for _, id := range lost {
			(*fn)(id)
		}
	}
}

// releaseLater is Unclaim without waiting for the leader: repairClaims
// sends it (a Claim of key by this node first drops it).
func (s *stream) releaseLater(key, holder string) {
	s.mu.Lock()
	if s.mu.granted[key] == holder {
		delete(s.mu.granted, key)
	}
	s.mu.releasing[claimRef{key, holder}] = struct{}{}
	s.mu.Unlock()
	signal(s.claimKick)
}
