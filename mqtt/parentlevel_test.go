package mqtt

import (
	"slices"
	"strings"
	"testing"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// mochi's index with parentLevel's additions finds, for every topic, the
// subscriptions logstore.MatchFilter (routing's, ACLs' and retained
// messages' matcher) says match it, and no other: every filter and topic
// of up to three levels over "a", "b", "" and the wildcards, and "$"
// topics.
func TestParentLevel_AgreesWithMatchFilter(t *testing.T) {
	var filters, topics []string
	levels := []string{"a", "b", "", "+", "#"}
	var grow func(prefix []string)
	grow = func(prefix []string) {
		if len(prefix) > 0 {
			f := strings.Join(prefix, "/")
			if logstore.ValidateFilter(f) == nil {
				filters = append(filters, f)
			}
			if f != "" && !strings.ContainsAny(f, "+#") { // a topic has at least one character
				topics = append(topics, f, "$"+f)
			}
		}
		if len(prefix) == 3 {
			return
		}
		for _, l := range levels {
			grow(append(slices.Clone(prefix), l))
		}
	}
	grow(nil)

	srv := mochi.New(nil)
	p := newParentLevel(srv)
	for _, f := range filters {
		cl := srv.NewClient(nil, "test", "c:"+f, false)
		srv.Clients.Add(cl)
		sub := packets.Subscription{Filter: f, Qos: 1}
		srv.Topics.Subscribe(cl.ID, sub)
		cl.State.Subscriptions.Add(f, sub)
		p.track(cl.ID, f)
	}
	for _, topic := range topics {
		subs := srv.Topics.Subscribers(topic)
		if len(subs.Shared) > 0 {
			subs = p.selectSubscribers(subs, packets.Packet{TopicName: topic})
		}
		if len(subs.Shared) > 0 {
			t.Errorf("topic %q: extra groups left: %v", topic, subs.Shared)
		}
		for _, f := range filters {
			_, got := subs.Subscriptions["c:"+f]
			if want := logstore.MatchFilter(f, topic); got != want {
				t.Errorf("topic %q, filter %q: found %v, MatchFilter says %v", topic, f, got, want)
			}
		}
	}
}

// An unsubscribed filter's extra subscription leaves mochi's index once
// it is next met, or swept.
func TestParentLevel_ForgetsWhatEnded(t *testing.T) {
	srv := mochi.New(nil)
	p := newParentLevel(srv)
	cl := srv.NewClient(nil, "test", "c", false)
	srv.Clients.Add(cl)
	sub := packets.Subscription{Filter: "a/+/#", Qos: 1}
	srv.Topics.Subscribe(cl.ID, sub)
	cl.State.Subscriptions.Add(sub.Filter, sub)
	p.track(cl.ID, sub.Filter)
	if len(srv.Topics.Subscribers("a/b").Shared) != 1 {
		t.Fatal("no extra subscription for a/+/#")
	}
	srv.Topics.Unsubscribe(sub.Filter, cl.ID)
	cl.State.Subscriptions.Delete(sub.Filter)
	subs := p.selectSubscribers(srv.Topics.Subscribers("a/b"), packets.Packet{TopicName: "a/b"})
	if len(subs.Subscriptions) != 0 {
		t.Errorf("a/b still goes to %v", subs.Subscriptions)
	}
	if len(srv.Topics.Subscribers("a/b").Shared) != 0 || len(p.subs) != 0 {
		t.Error("the extra subscription stayed after its filter was met unsubscribed")
	}

	for i := range 200 { // sessions that end without a publish to meet them
		id := "gone-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		c := srv.NewClient(nil, "test", id, false)
		srv.Clients.Add(c)
		c.State.Subscriptions.Add("z/+/#", sub)
		p.track(id, "z/+/#")
		srv.Clients.Delete(id)
	}
	p.mu.Lock()
	n := p.n
	p.mu.Unlock()
	if n > 2*64 {
		t.Errorf("%d entries kept for 200 sessions that ended, want a sweep to bound them", n)
	}
}
