package mqtt

import (
	"strings"
	"sync"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// Which connected clients a record of a captured topic goes to.
//
// Delivery keeps its own index of the connections' subscriptions instead
// of asking mochi's topic index, for two reasons. mochi's index misses
// '#' matching the parent level after '+' ("a/+/#" and topic "a/b"), and
// parses every level from the start of the topic; logstore.FilterIndex
// follows logstore.MatchFilter, the matcher of routing, ACLs and retained
// messages, and walks each level once. And a subscription has a start in
// each stream: the committed offset when it was made (OnSubscribed). A
// record below it was received before the SUBSCRIBE and is no live
// message for it [MQTT-4.5.0-1]; the shared reader may not have
// dispatched it yet when the client subscribes, so the start is kept with
// the subscription and checked at every dispatch. A resumed session's
// subscriptions have no start: where its delivery begins is the session's
// position (deliveryReader.join).
//
// The entries of a connection are added in OnSubscribed and
// OnSessionEstablished and removed in OnUnsubscribed and OnDisconnect;
// mochi's per-client map (cl.State.Subscriptions) stays the truth for the
// options of each subscription. Lock order: a reader's mu, then subs.mu.

// subEntry is one subscription of one connection.
type subEntry struct {
	cl     *mochi.Client
	filter string // as subscribed: $share/<group>/<filter> for a shared one
	shared bool
	// starts holds, per stream, the first offset it matches. A stream not
	// in it: while pending (its starts are being taken), nothing yet;
	// then (a resumed session's, or a stream added since) from 0.
	starts  map[string]uint64
	pending bool
}

// subIndex is the index of the connections' subscriptions.
type subIndex struct {
	mu struct {
		sync.RWMutex
		idx    logstore.FilterIndex[*subEntry]
		byConn map[*mochi.Client]map[string]*subEntry // by filter as subscribed
	}
}

func newSubIndex() *subIndex {
	x := &subIndex{}
	x.mu.byConn = map[*mochi.Client]map[string]*subEntry{}
	return x
}

// matchFilter is the filter of a subscription as matched against topics:
// a shared subscription's without its $share/<group>/ prefix.
func matchFilter(filter string) (string, bool) {
	if !mochi.IsSharedFilter(filter) {
		return filter, false
	}
	parts := strings.SplitN(filter, "/", 3)
	if len(parts) < 3 {
		return "", true
	}
	return parts[2], true
}

// add indexes cl's subscription to filter, pending when asked, and
// returns its entry, or nil when cl had it already (its start stays: a
// repeated SUBSCRIBE does not interrupt the flow [MQTT-3.8.4-3]) or the
// filter is not one to index.
func (x *subIndex) add(cl *mochi.Client, filter string, pending bool) *subEntry {
	inner, shared := matchFilter(filter)
	if logstore.ValidateFilter(inner) != nil {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	conn := x.mu.byConn[cl]
	if conn == nil {
		conn = map[string]*subEntry{}
		x.mu.byConn[cl] = conn
	}
	if conn[filter] != nil {
		return nil
	}
	e := &subEntry{cl: cl, filter: filter, shared: shared, pending: pending, starts: map[string]uint64{}}
	conn[filter] = e
	x.mu.idx.Add(inner, e)
	return e
}

// remove drops cl's subscription to filter.
func (x *subIndex) remove(cl *mochi.Client, filter string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeLocked(cl, filter)
}

func (x *subIndex) removeLocked(cl *mochi.Client, filter string) {
	conn := x.mu.byConn[cl]
	e := conn[filter]
	if e == nil {
		return
	}
	inner, _ := matchFilter(filter)
	x.mu.idx.Remove(inner, e)
	delete(conn, filter)
	if len(conn) == 0 {
		delete(x.mu.byConn, cl)
	}
}

// removeConn drops every subscription of the connection cl.
func (x *subIndex) removeConn(cl *mochi.Client) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for f := range x.mu.byConn[cl] {
		x.removeLocked(cl, f)
	}
}

// start sets e's start in stream. The caller holds the stream's reader's
// lock, so that the reader is not dispatching meanwhile.
func (x *subIndex) start(e *subEntry, stream string, off uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e.starts[stream] = off
}

// ready ends e's pending state: every stream has its start, and a stream
// added since starts at 0.
func (x *subIndex) ready(e *subEntry) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e.pending = false
}

// subscribers returns the subscriptions that rec of stream goes to, as
// mochi's TopicsIndex.Subscribers does (one merged subscription per client
// [MQTT-3.3.4-2], shared ones by filter and client), leaving out
// subscriptions made after rec was received.
func (x *subIndex) subscribers(stream string, rec *logstore.Record) *mochi.Subscribers {
	subs := &mochi.Subscribers{Subscriptions: map[string]packets.Subscription{}, Shared: map[string]map[string]packets.Subscription{}}
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.mu.idx.Match(rec.Topic, func(_ string, e *subEntry) {
		off, ok := e.starts[stream]
		if !ok && e.pending || rec.Offset < off || e.cl.Closed() {
			return
		}
		sub, ok := e.cl.State.Subscriptions.Get(e.filter)
		if !ok {
			return
		}
		id := e.cl.ID
		if e.shared {
			if subs.Shared[e.filter] == nil {
				subs.Shared[e.filter] = map[string]packets.Subscription{}
			}
			subs.Shared[e.filter][id] = sub
			return
		}
		cls, ok := subs.Subscriptions[id]
		if !ok {
			cls = sub
		}
		merged := cls.Merge(sub)
		// The retain flag is kept when one of them asked for it, whatever
		// order the index finds them in.
		merged.RetainAsPublished = cls.RetainAsPublished || sub.RetainAsPublished
		subs.Subscriptions[id] = merged
	})
	return subs
}

// indexSubscribed indexes cl's granted filters, each new one starting at
// each stream's committed offset, taken under the stream reader's lock.
func (d *delivery) indexSubscribed(cl *mochi.Client, pk packets.Packet, codes []byte) {
	if cl.Net.Inline {
		return // the inline client gets no record of a captured topic
	}
	var added []*subEntry
	for i, sub := range pk.Filters {
		if i < len(codes) && codes[i] < packets.ErrUnspecifiedError.Code {
			if e := d.subs.add(cl, sub.Filter, true); e != nil {
				added = append(added, e)
			}
		}
	}
	if len(added) == 0 {
		return
	}
	d.mu.RLock()
	readers := d.mu.readers
	d.mu.RUnlock()
	for _, r := range readers {
		r.mu.Lock()
		for _, e := range added {
			d.subs.start(e, r.stream.Name(), r.stream.Committed())
		}
		r.mu.Unlock()
	}
	for _, e := range added {
		d.subs.ready(e)
	}
}

// indexSession indexes the subscriptions a connection resumed with.
func (d *delivery) indexSession(cl *mochi.Client) {
	if cl.Net.Inline {
		return
	}
	for f := range cl.State.Subscriptions.GetAll() {
		d.subs.add(cl, f, false)
	}
}
