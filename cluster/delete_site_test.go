package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
)

// listed is a node's configured streams: names, each of factor 3.
func listed(names ...string) []SiteStream {
	var out []SiteStream
	for _, name := range names {
		out = append(out, SiteStream{Name: name, ReplicationFactor: 3})
	}
	return out
}

// waitLists waits until the controller's state has what every node
// lists, printing the state's brokers if it never does.
func waitLists(t *testing.T, from *testNode, lists map[string][]string) {
	t.Helper()
	var st *rules.State
	defer func() {
		if t.Failed() && st != nil {
			for id, b := range st.Brokers {
				t.Logf("%s: %+v", id, *b)
			}
		}
	}()
	eventually(t, fmt.Sprintf("the state records the configured streams %v", lists), func() bool {
		st = from.Node.View()
		for id, want := range lists {
			if b := st.Brokers[id]; b == nil || !slices.Equal(b.Lists, want) {
				return false
			}
		}
		return true
	})
}

func stored(t *testing.T, d *testNode, name string) bool {
	t.Helper()
	un, err := d.store.Unlisted()
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(un, func(u logstore.StoredStream) bool { return u.Name == name }) || d.store.Stream(name) != nil
}

// A stream deleted from a three-node site: refused while a node lists it;
// then every replica deletes its copy, the one down at the time too once
// it is back, even with the stream listed again and created anew
// meanwhile: the new stream starts at offset 0 on every replica and never
// shows the deleted one's records.
func TestSite_DeleteStream(t *testing.T) {
	nodes := newTestSite(t, siteOpts{IDs: []string{"a", "b", "c"}, Streams: listed("keep", "old")}).nodes
	a, b, c := nodes[0], nodes[1], nodes[2]
	eventually(t, "every node serves old with a full ISR", func() bool {
		st := a.Node.View().Streams["old"]
		if st == nil || len(st.ISR) != 3 {
			return false
		}
		for _, d := range nodes {
			if d.Log.Stream("old") == nil {
				return false
			}
		}
		return true
	})
	for i := range 50 {
		if _, err := logAppend(t, a.Log.Stream("old"), &logstore.Record{Topic: "old/x", QoS: 1, Payload: fmt.Appendf(nil, "old-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range nodes {
		eventually(t, d.id+" holds the 50 records", func() bool { return d.store.Stream("old").Committed() == 50 })
	}

	// a and b no longer list it; c still does: the deletion is refused.
	for _, d := range []*testNode{a, b} {
		d.stop(t)
		d.restart(t, listed("keep")...)
	}
	waitLists(t, c, map[string][]string{"a": {"keep"}, "b": {"keep"}, "c": {"keep", "old"}})
	if !stored(t, a, "old") {
		t.Fatal("a's copy of old went with its configuration line")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.DeleteStream(ctx, "old"); !errors.Is(err, ErrStreamListed) || !strings.Contains(err.Error(), "[c]") {
		t.Fatalf("delete while c lists old = %v, want ErrStreamListed naming c", err)
	}

	// c no longer lists it either, and is down when the site deletes it.
	c.stop(t)
	c.restart(t, listed("keep")...)
	waitLists(t, a, map[string][]string{"a": {"keep"}, "b": {"keep"}, "c": {"keep"}})
	c.crash(t)
	eventually(t, "the site sees c failed", func() bool { return !a.Node.View().Brokers["c"].Alive })
	if err := a.DeleteStream(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*testNode{a, b} {
		eventually(t, d.id+" deleted its copy", func() bool { return !stored(t, d, "old") })
	}

	// Listed again on a and b: a new stream, from offset 0.
	for _, d := range []*testNode{a, b} {
		d.stop(t)
		d.restart(t, listed("keep", "old")...)
	}
	eventually(t, "old is created again", func() bool { return a.Log.Stream("old") != nil })
	for i := range 5 {
		var off uint64
		eventually(t, fmt.Sprintf("record %d of the new stream is acknowledged", i), func() bool {
			var err error
			off, err = logAppend(t, a.Log.Stream("old"), &logstore.Record{Topic: "old/x", QoS: 1, Payload: fmt.Appendf(nil, "new-%d", i)})
			return err == nil // a refusal stores nothing: the leader may still be starting
		})
		if off != uint64(i) {
			t.Fatalf("record %d of the new stream at offset %d", i, off)
		}
	}

	// c comes back listing old, with the deleted stream's 50 records on
	// its disk: it empties them and follows the new stream.
	c.restart(t, listed("keep", "old")...)
	for _, d := range nodes {
		eventually(t, d.id+" holds the new stream's 5 records", func() bool {
			s := d.store.Stream("old")
			return s != nil && s.NextOffset() == 5 && s.Committed() == 5
		})
		recs, err := d.store.Stream("old").Read(0, 100, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range recs {
			if want := fmt.Sprintf("new-%d", i); string(r.Payload) != want {
				t.Fatalf("%s: offset %d holds %q, want %q", d.id, i, r.Payload, want)
			}
		}
	}
}
