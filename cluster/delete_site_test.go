package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
)

// delNode is an in-process node of a test site that restarts on its own
// data and addresses with another list of streams, as a real node
// restarts with an edited configuration.
type delNode struct {
	id, dir    string
	serf, raft string
	expect     int
	join       []string

	site  *Site
	store *logstore.Store
	logs  *syncBuf
	down  bool
}

func (d *delNode) start(t *testing.T, streams ...string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.NodeID, cfg.Voter, cfg.BootstrapExpect, cfg.Join = d.id, true, d.expect, d.join
	cfg.SerfAddr, cfg.RaftAddr = cmpOr(d.serf, "127.0.0.1:0"), cmpOr(d.raft, "127.0.0.1:0")
	cfg.SnapshotDir = d.dir + "/snapshots"
	cfg.MQTTAddr, cfg.Version = "127.0.0.1:1883", "test"
	d.logs = &syncBuf{}
	cfg.Logger = slog.New(slog.NewTextHandler(d.logs, nil))
	var scs []logstore.StreamConfig
	var site []SiteStream
	for _, name := range streams {
		scs = append(scs, logstore.StreamConfig{Name: name, Filters: []string{name + "/#"}})
		site = append(site, SiteStream{Name: name, ReplicationFactor: 3})
	}
	store, err := logstore.Open(logstore.Config{Dir: d.dir + "/store", Profile: logstore.ProfilePiZero, Streams: scs,
		RetentionInterval: time.Hour, MinFreeBytes: -1, ManualCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := StartSite(SiteConfig{Node: cfg, TransportListen: "127.0.0.1:0", Store: store, Streams: site,
		LagMax: 2 * time.Second, Logger: cfg.Logger})
	if err != nil {
		_ = store.Close()
		t.Fatal(err)
	}
	d.site, d.store, d.down = s, store, false
	d.serf, d.raft = s.Node.SerfAddr(), s.Node.RaftAddr()
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// stop is a clean stop (hand-over); crash stops as kill -9 would.
func (d *delNode) stop(t *testing.T) {
	t.Helper()
	if d.down {
		return
	}
	d.down = true
	if err := d.site.Close(); err != nil {
		t.Logf("close %s: %v", d.id, err)
	}
	if err := d.store.Close(); err != nil {
		t.Errorf("close %s's store: %v", d.id, err)
	}
}

func (d *delNode) crash(t *testing.T) {
	t.Helper()
	d.down = true
	close(d.site.stop)
	d.site.wg.Wait()
	_ = d.site.Log.Close()
	d.site.Replicator.Close()
	_ = d.site.Server.Close()
	_ = d.site.Node.Close()
	_ = d.store.Close()
}

// lists waits until the controller's state has what every node lists.
func waitLists(t *testing.T, from *delNode, lists map[string][]string) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		st := from.site.Node.View()
		ok := true
		for id, want := range lists {
			if b := st.Brokers[id]; b == nil || !slices.Equal(b.Lists, want) {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			for id, b := range st.Brokers {
				t.Logf("%s: %+v", id, *b)
			}
			t.Fatalf("timed out waiting until the state records the configured streams %v", lists)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func stored(t *testing.T, d *delNode, name string) bool {
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
	var nodes []*delNode
	for i, id := range []string{"a", "b", "c"} {
		d := &delNode{id: id, dir: t.TempDir(), expect: 3}
		if i > 0 {
			d.join = []string{nodes[0].serf}
		}
		d.start(t, "keep", "old")
		nodes = append(nodes, d)
	}
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			for _, d := range nodes {
				if t.Failed() {
					t.Logf("log of %s:\n%s", d.id, d.logs)
				}
				d.stop(t)
			}
		})
	})
	a, b, c := nodes[0], nodes[1], nodes[2]
	for _, d := range nodes { // a restart joins the others, as a real node's join lists the site
		d.join = []string{a.serf, b.serf, c.serf}
	}
	eventually(t, "every node serves old with a full ISR", func() bool {
		st := a.site.Node.View().Streams["old"]
		if st == nil || len(st.ISR) != 3 {
			return false
		}
		for _, d := range nodes {
			if d.site.Log.Stream("old") == nil {
				return false
			}
		}
		return true
	})
	for i := range 50 {
		if _, err := logAppend(t, a.site.Log.Stream("old"), &logstore.Record{Topic: "old/x", QoS: 1, Payload: fmt.Appendf(nil, "old-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range nodes {
		eventually(t, d.id+" holds the 50 records", func() bool { return d.store.Stream("old").Committed() == 50 })
	}

	// a and b no longer list it; c still does: the deletion is refused.
	for _, d := range []*delNode{a, b} {
		d.stop(t)
		d.start(t, "keep")
	}
	waitLists(t, c, map[string][]string{"a": {"keep"}, "b": {"keep"}, "c": {"keep", "old"}})
	if !stored(t, a, "old") {
		t.Fatal("a's copy of old went with its configuration line")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.site.DeleteStream(ctx, "old"); !errors.Is(err, ErrStreamListed) || !strings.Contains(err.Error(), "[c]") {
		t.Fatalf("delete while c lists old = %v, want ErrStreamListed naming c", err)
	}

	// c no longer lists it either, and is down when the site deletes it.
	c.stop(t)
	c.start(t, "keep")
	waitLists(t, a, map[string][]string{"a": {"keep"}, "b": {"keep"}, "c": {"keep"}})
	c.crash(t)
	eventually(t, "the site sees c failed", func() bool { return !a.site.Node.View().Brokers["c"].Alive })
	if err := a.site.DeleteStream(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*delNode{a, b} {
		eventually(t, d.id+" deleted its copy", func() bool { return !stored(t, d, "old") })
	}

	// Listed again on a and b: a new stream, from offset 0.
	for _, d := range []*delNode{a, b} {
		d.stop(t)
		d.start(t, "keep", "old")
	}
	eventually(t, "old is created again", func() bool { return a.site.Log.Stream("old") != nil })
	for i := range 5 {
		var off uint64
		eventually(t, fmt.Sprintf("record %d of the new stream is acknowledged", i), func() bool {
			var err error
			off, err = logAppend(t, a.site.Log.Stream("old"), &logstore.Record{Topic: "old/x", QoS: 1, Payload: fmt.Appendf(nil, "new-%d", i)})
			return err == nil // a refusal stores nothing: the leader may still be starting
		})
		if off != uint64(i) {
			t.Fatalf("record %d of the new stream at offset %d", i, off)
		}
	}

	// c comes back listing old, with the deleted stream's 50 records on
	// its disk: it empties them and follows the new stream.
	c.start(t, "keep", "old")
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
