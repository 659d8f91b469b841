package cluster

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/peatmq/peat/mqtt"
)

// Orphaned sessions.
//
// Expiry is run by the node holding a session's claim (its mochi
// expires the disconnected client), or by the node its client connects
// to next. A node that dies, leaves or restarts (it reads sessions at
// connect, not at start) leaves its sessions to no one, so the leader of
// SessionsStream adopts them: at every change of the
// controller's state or of its leadership, and every 5 s, it looks in
// its replica for claims whose node the state has failed or in another
// broker epoch (the claims' lease above) and offers their client ids to
// mqtt on its node (OnSessionsOrphaned). mqtt adopts each one
// (AdoptSession: a claim decided on the leader under claims.dec, granted
// only while the holder is still gone, so a client claiming meanwhile
// keeps it), reads it, counts one stored while connected as
// disconnected from the adoption (and writes that time, so a next
// adopter keeps the clock), and deletes it site-wide once its expiry
// runs out, by mochi's rule; its client claims it back from the adopter
// like from any node (mqtt's sessions_orphans.go). A node seen failed
// wrongly (a partition) that comes back in its epoch finds the claims
// moved and closes its connections of those clients, as after any
// take-over: the site decided they were gone. An adopter that dies in
// turn is a gone holder like any other. A stored session that no claim
// holds (a late write of an older node, which is not fenced; claims lost
// with the stream's data, SessionsStream having no unclean election) is
// offered too, and adopted once AdoptSession, under claims.dec, finds it
// still stored and unclaimed: its expiry runs. A client connected to a
// node whose claim was lost then loses its connection (the move, as for
// a fenced write), and claims the session back when it reconnects.

// orphanScanInterval is how often the sessions' leader looks for claims
// of gone nodes besides when the controller's state or its leadership
// changes: it retries an adoption that failed (no ISR yet) and picks up
// what a view of the state taken before a change missed.
const orphanScanInterval = 5 * time.Second

// OnSessionsOrphaned sets fn (nil: none), called on the node leading the
// sessions' stream with the client ids whose claim names a node the
// controller's state has failed or in another epoch, or whose stored
// session no claim holds, at every change of that state or of the
// leadership and every orphanScanInterval until they are adopted or
// claimed. fn must not block.
func (l *Log) OnSessionsOrphaned(fn func(ids []string)) {
	if fn == nil {
		l.orphaned.Store(nil)
		return
	}
	l.orphaned.Store(&fn)
}

// orphans is the sessions' stream's adoption of its orphaned sessions:
// while this node leads the stream, watch offers them to mqtt, and adopt
// takes one over, a claim decided under the claims' locks like any
// other. Only SessionsStream has one; it ends when the stream closes.
type orphans struct {
	s    *stream       // the sessions' stream
	done chan struct{} // watch ended
}

func newOrphans(s *stream) *orphans {
	return &orphans{s: s, done: make(chan struct{})}
}

// AdoptSession makes this node, which leads the sessions' stream, the
// holder of client id's session if its claim still names a gone node,
// or if no claim holds it and it is stored: a claim like ClaimSession's,
// decided on this leader under the same lock, so a client claiming
// meanwhile keeps its claim, and the old node, back in the same epoch
// after a partition, applies the move (OnSessionTaken) and drops its
// late writes. False when this node does not lead the
// stream, the claim's node is alive again, another node claimed it, an
// unclaimed session is gone, or the ISR did not take the claim.
func (l *Log) AdoptSession(ctx context.Context, id string) bool {
	st := l.stream(SessionsStream)
	if st == nil {
		return false
	}
	return st.orphans.adopt(ctx, id)
}

// adopt is AdoptSession on the sessions' stream.
func (o *orphans) adopt(ctx context.Context, key string) bool {
	s, c := o.s, o.s.claims
	c.op.Lock()
	defer c.op.Unlock()
	if s.closedErr("adopt in") != nil {
		return false
	}
	ld := s.noteLeader()
	if ld == nil {
		return false
	}
	ctx, cancel := c.ctxFrom(ctx, rpcTimeout)
	defer cancel()
	c.dec.Lock()
	cur, held, err := c.load(key)
	orphan := held && c.holderGone(cur)
	if err == nil && !held {
		orphan, err = o.stored(key)
	}
	if err == nil && orphan {
		err = c.put(ctx, ld, key, cur, held, claimHolder{holder: key, node: s.l.node.ID(), epoch: s.l.node.Epoch()})
		held = err == nil
	} else {
		held = false
	}
	c.dec.Unlock()
	if err != nil {
		s.l.log.Debug("cluster: orphaned session not adopted", slog.String("client", key), slog.Any("err", err))
		return false
	}
	if held {
		c.granted(key, key)
	}
	return held
}

// watch runs until the stream closes, offering the claims of gone nodes
// to mqtt while this node leads the stream.
func (o *orphans) watch() {
	defer close(o.done)
	s := o.s
	t := time.NewTicker(orphanScanInterval)
	defer t.Stop()
	for {
		_, changed := s.l.node.Watch()
		_, moved := s.l.rep.Leading(s.name)
		o.offer()
		select {
		case <-s.stop:
			return
		case <-changed:
		case <-moved:
		case <-t.C:
		}
	}
}

// stored reports whether client id's session is in this replica's state.
func (o *orphans) stored(id string) (bool, error) {
	key, found := mqtt.SiteSessionKey(id), false
	err := o.s.st.LoadState(key, func(k string, _ []byte) error {
		found = found || k == key
		return nil
	})
	return found, err
}

// offer makes one pass of watch: the claims of gone nodes, and the
// stored sessions that no claim holds.
func (o *orphans) offer() {
	s := o.s
	fn := s.l.orphaned.Load()
	if fn == nil || s.noteLeader() == nil {
		return
	}
	var ids []string
	claimed := map[string]bool{}
	err := s.st.LoadState(claimStatePrefix, func(k string, v []byte) error {
		id := strings.TrimPrefix(k, claimStatePrefix)
		claimed[id] = true
		if h, err := decodeClaim(v); err == nil && s.claims.holderGone(h) {
			ids = append(ids, id)
		}
		return nil
	})
	if err == nil {
		err = s.st.LoadState(mqtt.SiteSessionKey(""), func(k string, _ []byte) error {
			if id, ok := mqtt.SiteSessionClient(k); ok && !claimed[id] {
				ids = append(ids, id)
			}
			return nil
		})
	}
	if err != nil {
		s.l.log.Debug("cluster: looking for orphaned sessions", slog.Any("err", err))
		return
	}
	if len(ids) > 0 {
		(*fn)(ids)
	}
}
