package mqtt

import (
	"strings"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// '#' at the parent level, for topics no stream captures.
//
// A filter ending in '#' matches the level before it too: "sport/#"
// matches "sport" [MQTT-4.7.1-2]. Topics a stream captures are matched by
// logstore's matcher (delivery_match.go, delivery_retained.go); the rest
// go through mochi's topic index, which (v2.7.9) misses that level in two
// places:
//
//   - live: a filter whose '#' follows '+' ("a/+/#", "+/#",
//     "$share/g/+/#") does not get a publish to "a/b" or "a";
//   - retained: no filter "P/#" gets the retained message at P's level
//     ("a/#" does not get "a", "+/#" none of one level).
//
// Live: for each filter of the first kind, the index holds one extra
// subscription, to the shared filter "$share/<U+0000peat>/<parent>" ("a/+"
// for "a/+/#") of a client id no client can have (U+0000 is refused in
// every MQTT string). A publish at the parent level then finds it, and
// mochi asks OnSelectSubscribers, where the clients subscribed to the
// filter are added, and the extra group taken out. parentLevel keeps
// which client ids subscribed to each such filter; mochi's client and
// its subscriptions stay the truth, checked at every use, so an entry of
// a session that ended is dropped when next met, or swept.
//
// Retained: a new subscription "P/#" (that gets retained messages: Retain
// Handling, not shared) is sent mochi's retained messages matching P
// through delivery, beside the ones mochi sends (delivery_retained.go).

// parentGroup is the share group, and parentClient the client id, of the
// index's extra subscriptions.
const (
	parentGroup  = "\x00peat"
	parentClient = "\x00peat"
	parentPrefix = "$share/" + parentGroup + "/"
)

// parentLevel tracks the subscriptions whose filter ends in "+/#".
type parentLevel struct {
	srv *mochi.Server

	mu sync.Mutex
	// subs holds, by filter without any $share prefix, the client ids
	// subscribed to it and the filter as each subscribed.
	subs map[string]map[parentSub]struct{}
	// n counts the entries; swept is n after the last sweep.
	n, swept int
}

type parentSub struct{ client, filter string }

func newParentLevel(srv *mochi.Server) *parentLevel {
	return &parentLevel{srv: srv, subs: map[string]map[parentSub]struct{}{}}
}

// missesLive reports whether mochi's index misses inner, a filter
// without $share prefix, at its parent level: '#' after '+'.
func missesLive(inner string) bool {
	return inner == "+/#" || strings.HasSuffix(inner, "/+/#")
}

// track notes that client id subscribed to filter (as subscribed).
func (p *parentLevel) track(id, filter string) {
	inner, _ := matchFilter(filter)
	if !missesLive(inner) || strings.ContainsRune(id, 0) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.subs[inner]
	if set == nil {
		set = map[parentSub]struct{}{}
		p.subs[inner] = set
		p.srv.Topics.Subscribe(parentClient, packets.Subscription{Filter: parentPrefix + parentOf(inner)})
	}
	e := parentSub{id, filter}
	if _, ok := set[e]; ok {
		return
	}
	set[e] = struct{}{}
	p.n++
	if p.n > 2*p.swept+64 { // amortised: entries stay within twice the live ones
		p.sweepLocked()
	}
}

// parentOf is filter without its trailing "/#".
func parentOf(filter string) string { return strings.TrimSuffix(filter, "/#") }

// live returns client id's subscription to filter, or false when the
// client or its subscription is gone.
func (p *parentLevel) live(e parentSub) (packets.Subscription, bool) {
	cl, ok := p.srv.Clients.Get(e.client)
	if !ok {
		return packets.Subscription{}, false
	}
	return cl.State.Subscriptions.Get(e.filter)
}

// sweepLocked drops the entries of subscriptions that are gone, and the
// index's extra subscription of a filter nobody holds. p.mu is held.
func (p *parentLevel) sweepLocked() {
	for inner, set := range p.subs {
		for e := range set {
			if _, ok := p.live(e); !ok {
				delete(set, e)
				p.n--
			}
		}
		p.dropIfEmptyLocked(inner)
	}
	p.swept = p.n
}

func (p *parentLevel) dropIfEmptyLocked(inner string) {
	if len(p.subs[inner]) == 0 {
		delete(p.subs, inner)
		p.srv.Topics.Unsubscribe(parentPrefix+parentOf(inner), parentClient)
	}
}

// selectSubscribers is OnSelectSubscribers: for each extra group that
// matched pk's topic, it adds the subscribers of its filter, and takes
// the group out.
func (p *parentLevel) selectSubscribers(subs *mochi.Subscribers, pk packets.Packet) *mochi.Subscribers {
	for filter := range subs.Shared {
		parent, ok := strings.CutPrefix(filter, parentPrefix)
		if !ok {
			continue
		}
		delete(subs.Shared, filter)
		inner := parent + "/#"
		if !logstore.MatchFilter(inner, pk.TopicName) {
			continue
		}
		p.mu.Lock()
		for e := range p.subs[inner] {
			sub, ok := p.live(e)
			if !ok {
				delete(p.subs[inner], e)
				p.n--
				continue
			}
			if mochi.IsSharedFilter(e.filter) {
				if subs.Shared[e.filter] == nil {
					subs.Shared[e.filter] = map[string]packets.Subscription{}
				}
				subs.Shared[e.filter][e.client] = sub
				continue
			}
			cls, ok := subs.Subscriptions[e.client]
			if !ok {
				cls = sub
			}
			merged := cls.Merge(sub)
			merged.RetainAsPublished = cls.RetainAsPublished || sub.RetainAsPublished
			subs.Subscriptions[e.client] = merged
		}
		p.dropIfEmptyLocked(inner)
		p.mu.Unlock()
	}
	return subs
}

// hasParentLevel reports whether filter is "P/#", which matches P's
// level too: mochi leaves the retained messages there out.
func hasParentLevel(filter string) bool {
	return filter != "#" && strings.HasSuffix(filter, "/#")
}

// retained returns the retained messages mochi holds (topics no stream
// captures) at the parent level of filter "P/#": those matching P, which
// mochi's index leaves out of the filter's; none for other filters, and
// none expired.
func (p *parentLevel) retained(filter string) []packets.Packet {
	if !hasParentLevel(filter) {
		return nil
	}
	now := time.Now().Unix()
	var out []packets.Packet
	for _, pk := range p.srv.Topics.Messages(parentOf(filter)) {
		if pk.Expiry > 0 && pk.Expiry < now {
			continue
		}
		out = append(out, pk)
	}
	return out
}

// retainedRecord is a retained message of mochi's store as delivery
// sends it.
func retainedRecord(pk packets.Packet) *logstore.Record {
	rec := recordOf(pk.Origin, &pk)
	rec.Retain = true
	rec.Timestamp = pk.Created * 1000
	return rec
}
