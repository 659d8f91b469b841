package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Deleting a stream (the state's side is rules.DeleteStream).
//
// A stream left out of a node's configuration stays in the state and on
// every disk: a line missing (a typo) must never delete a site's data.
// Site.DeleteStream (`peat stream delete`, DELETE /api/v1/streams/<name>)
// deletes it:
//
//   - Each node tells the controller which streams its configuration
//     lists (ListStreams, once the controller registered its broker
//     epoch, and again when the list differs; Broker.Lists). DeleteStream
//     is refused (rules.ErrStreamListed, naming the nodes) while a broker not
//     removed lists the stream, down or not: createStreams on that node
//     would create it again at once, or when it is back. The operator
//     removes it from every node's streams: and restarts them (a rolling
//     restart), then deletes; a node gone for good is removed first
//     (remove-node). edge refuses too while the node asked lists it.
//   - Every creation gets an incarnation, State.Incarnations counting
//     (Stream.Created; 0 for streams created before deletions existed).
//     DeleteStream names the incarnation it deletes, so a request that
//     raced a re-creation deletes nothing; the state keeps a tombstone,
//     Deleted[name] = that incarnation (a few bytes per name, for good:
//     a node away for months still learns of it).
//   - Each replica records in its store which incarnation its records
//     belong to (logstore's SetIncarnation). A stream with none is
//     adopted (stamped) unless a tombstone names it; one stamped with
//     another incarnation, or unstamped under a tombstone, holds a
//     deleted stream's records: neither the Replicator (currentReplica)
//     nor the Log (refresh) serves it, so it can neither lead with the
//     old records nor show them to a subscriber.
//   - followDeletions, at start and at every state change, deletes
//     the stored copy of a tombstoned stream the configuration no longer
//     lists (logstore DeleteStream, crash-safe), and empties
//     (ResetStream) a listed stream whose records belong to a deleted
//     incarnation: the stream was deleted and created again while this
//     node was down, and it then fetches the new stream from offset 0.
//     A node down at the time of the deletion does either when it is
//     back, from the state Raft gives it.
//   - Before either, it deletes the positions a Peat of key layout 3
//     kept of the stream in the node's own state, by its name
//     (mqtt.ForgetLegacy): mqtt's start would move them into a stream
//     created again under that name. A stop in between leaves the copy
//     without them, and the next pass deletes it.

// DeleteStream deletes stream name from the site: the controller takes
// it out of its state with a tombstone, and every node deletes its copy
// (followDeletions), a node down now once it is back. It returns once
// the controller recorded it. Refused with ErrStreamListed while a node's
// configuration (as it registered it at its last start) lists the
// stream, ErrUnknownStream for a stream the state lacks.
func (s *Site) DeleteStream(ctx context.Context, name string) error {
	if name == SessionsStream { // no configuration lists it: it is the site's own
		return fmt.Errorf("delete %s: the site's durable sessions live in it: %w", name, ErrStreamListed)
	}
	st := s.Node.View().Streams[name]
	if st == nil {
		return fmt.Errorf("delete %s: %w", name, ErrUnknownStream)
	}
	if err := s.Node.Submit(ctx, rules.DeleteStream{Name: name, Created: st.Created}); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// currentReplica is the Replicator's view of this node's store: a stream
// whose records belong to the incarnation the state holds
// (servesIncarnation), else nil until followDeletions has emptied it.
func currentReplica(node *Node, store *logstore.Store) func(string) *logstore.Stream {
	return func(name string) *logstore.Stream {
		ls := store.Stream(name)
		if ls == nil {
			return nil
		}
		st := node.View()
		if cs := st.Streams[name]; cs != nil && !servesIncarnation(ls, cs, st) {
			return nil
		}
		return ls
	}
}

// servesIncarnation reports whether this node's stream ls holds records
// of the state's stream cs, recording the incarnation on a stream that
// has none yet when no stream of that name was ever deleted (a stream of
// an older Peat, or a new one). A stream with another incarnation, or
// none where a tombstone says one was deleted, holds a deleted stream's
// records: it must be emptied (ResetStream) before it serves.
func servesIncarnation(ls *logstore.Stream, cs *rules.Stream, st *rules.State) bool {
	switch have := ls.Incarnation(); {
	case have == cs.Created:
		return true
	case have != 0:
		return false
	}
	if _, deleted := st.Deleted[cs.Name]; deleted {
		return false
	}
	return ls.SetIncarnation(cs.Created) == nil
}

// followDeletions keeps this node's store in line with the state's
// deletions: it tells the controller which streams this node's
// configuration lists (ListStreams), deletes the stored copy of a
// deleted stream that the configuration no longer lists, and empties a
// listed stream whose records belong to a deleted incarnation (the
// stream was deleted and created again while this node was away). It
// runs at start and at every state change (every second after a
// failure), so a node down at the time does it when it is back.
func (s *Site) followDeletions() {
	defer s.wg.Done()
	names := make([]string, 0, len(s.cfg.Streams))
	for _, c := range s.cfg.Streams {
		if c.Name != SessionsStream { // the site's own (DeleteStream refuses it)
			names = append(names, c.Name)
		}
	}
	slices.Sort(names)
	again := true // the store is looked at on a state change, or after a failure
	for {
		st, changed := s.Node.State()
		s.listOwnStreams(st, names)
		if again {
			again = !s.deleteCopies(st)
		}
		t := time.NewTimer(siteRetry)
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-changed:
			again = true
		case <-t.C:
		}
		t.Stop()
	}
}

// listOwnStreams submits ListStreams once the controller registered this
// run's broker epoch, and again whenever the state's list differs.
func (s *Site) listOwnStreams(st *rules.State, names []string) {
	b := st.Brokers[s.Node.ID()]
	if b == nil || b.Epoch != s.Node.Epoch() || slices.Equal(b.Lists, names) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Node.Submit(ctx, rules.ListStreams{ID: s.Node.ID(), Epoch: s.Node.Epoch(), Names: names}); err != nil {
		s.log.Info("cluster: configured streams not recorded yet", slog.Any("err", err))
	}
}

// deleteCopies deletes or empties what of st's deleted streams this
// node's store still holds; done is false when something failed.
func (s *Site) deleteCopies(st *rules.State) (done bool) {
	if len(st.Deleted) == 0 {
		return true
	}
	done = true
	store := s.cfg.Store
	un, err := store.Unlisted()
	if err != nil {
		s.log.Warn("cluster: stored streams not read", slog.Any("err", err))
		done = false
	}
	for _, u := range un {
		if _, deleted := st.Deleted[u.Name]; !deleted {
			continue // never deleted: kept, whatever the configuration says
		}
		if cs := st.Streams[u.Name]; cs != nil && u.Incarnation != 0 && u.Incarnation == cs.Created {
			continue // a replica of the stream created again, merely unlisted here
		}
		if err := s.forgetLegacy(u.Name); err != nil {
			done = false
			continue
		}
		if err := store.DeleteStream(u.Name); err != nil {
			s.log.Warn("cluster: deleted stream's copy not deleted yet", slog.String("stream", u.Name), slog.Any("err", err))
			done = false
			continue
		}
		s.log.Info("cluster: deleted stream's copy deleted", slog.String("stream", u.Name),
			slog.Uint64("records", u.NextOffset-u.FirstOffset), slog.Int64("bytes", u.Bytes))
	}
	for _, ls := range store.Streams() {
		cs := st.Streams[ls.Name()]
		if cs == nil || servesIncarnation(ls, cs, st) {
			continue
		}
		if err := s.forgetLegacy(ls.Name()); err != nil {
			done = false
			continue
		}
		if _, err := store.ResetStream(ls.Name(), cs.Created); err != nil {
			s.log.Warn("cluster: copy of a deleted stream not emptied yet", slog.String("stream", ls.Name()), slog.Any("err", err))
			done = false
			continue
		}
		s.log.Warn("cluster: this node held a deleted stream of the same name: emptied it for the new one",
			slog.String("stream", ls.Name()), slog.Uint64("records", ls.NextOffset()-ls.FirstOffset()))
		s.Replicator.nudge()
	}
	return done
}

// forgetLegacy deletes the positions of stream name that a Peat of key
// layout 3 kept in this node's own state, before the stream's copy goes:
// a stream created later under that name must not take them over
// (mqtt.ForgetLegacy).
func (s *Site) forgetLegacy(name string) error {
	err := mqtt.ForgetLegacy(s.Log, name)
	if err != nil {
		s.log.Warn("cluster: deleted stream's old consumer positions not deleted yet", slog.String("stream", name), slog.Any("err", err))
	}
	return err
}
