package edge

import (
	"context"
	"encoding/binary"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/peatmq/peat/logstore"
)

// In a site the node asked refuses a stream its own configuration lists,
// and a stream the controller does not know is 404: the request reaches
// the controller only for a stream that can be deleted.
func TestCluster_DeleteStreamRefusals(t *testing.T) {
	nodes := startSiteNodes(t, 1)
	base := "http://" + nodes[0].HTTPAddr().String() + "/api/v1/streams/"
	if code, _, body := get(t, http.MethodDelete, base+"default"); code != http.StatusConflict ||
		!strings.Contains(string(body), "remove it from streams:") {
		t.Fatalf("DELETE default: %d %s, want 409 saying to remove it from streams:", code, body)
	}
	if code, _, body := get(t, http.MethodDelete, base+"nope"); code != http.StatusNotFound ||
		!strings.Contains(string(body), "unknown stream") {
		t.Fatalf("DELETE nope: %d %s, want 404 from the controller", code, body)
	}
	if st := nodes[0].site.Load().Node.View().Streams["default"]; st == nil {
		t.Fatal("the refused deletion removed the stream from the state")
	}
}

// A node upgraded from a Peat of key layout 3 keeps consumer positions of
// a stream it no longer lists in its own state, by the stream's name.
// Deleting that stream deletes them: a stream created later under the
// same name starts its group and its sessions' offsets where new ones
// start, not at the deleted stream's offsets (skipping records, or
// delivering some the session never subscribed for).
func TestNode_DeleteStreamForgetsLayout3Positions(t *testing.T) {
	with := testConfig(t)
	with.Streams = []StreamConfig{defaultStream("keep", "keep/#"), defaultStream("meters", "meters/#")}
	without := with
	without.Streams = with.Streams[:1]

	n := startNode(t, with)
	publishQoS1(t, n.MQTTAddr(), "meters/a", 10)
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// What a layout 3 Peat left: group billing at offset 8 of meters,
	// session dur at offset 1 of it, and dur's $replay of it at 8.
	store, err := logstore.Open(without.StoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	const replay = "$replay/earliest/+/meters/#"
	sess, err := msgpack.Marshal(map[string]any{
		"v": 5, "e": 3600, "ef": true,
		"s": map[string]any{"meters/#": map[string]any{"f": "meters/#", "q": 1}, replay: map[string]any{"f": replay, "q": 1}},
		"o": map[string]uint64{"meters": 1, "$tap:" + replay: 8},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = store.WriteState(map[string][]byte{"g/billing/meters": binary.BigEndian.AppendUint64(nil, 8), "s/dur": sess}, nil)
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	n = startNode(t, without)
	if code, _, body := get(t, http.MethodDelete, "http://"+n.HTTPAddr().String()+"/api/v1/streams/meters"); code != http.StatusOK {
		t.Fatalf("DELETE meters: %d %s", code, body)
	}
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	n = startNode(t, with) // a new stream meters
	publishQoS1(t, n.MQTTAddr(), "meters/a", 3)
	got := make(chan string, 100)
	worker, _ := v5Client(t, n, "worker", 0, got)
	v5Subscribe(t, worker, "$group/billing/+/meters/#")
	waitDelivered(t, got, "the group's delivery of offset 0 (a new group starts at the earliest)", func(topic string) bool {
		return strings.HasPrefix(topic, "$group/billing/0/meters/a ")
	})

	got = make(chan string, 100)
	if _, present := v5Client(t, n, "dur", 3600, got); !present {
		t.Fatal("dur's session is not present")
	}
	publishQoS1(t, n.MQTTAddr(), "meters/b", 3)
	// A new session's offset is the log end when it connects (3): the
	// records before are not its own, the 3 after are.
	live, replayed := 0, false
	waitDelivered(t, got, "dur's replay from offset 0 and its 3 live messages", func(m string) bool {
		if strings.HasPrefix(m, "meters/a ") {
			t.Fatalf("dur resumed at its deleted stream's offset: got %q", m)
		}
		if strings.HasPrefix(m, "meters/b ") {
			live++
		}
		replayed = replayed || strings.HasPrefix(m, "$replay/earliest/0/meters/a ")
		return live == 3 && replayed
	})
}

// waitDelivered reads "topic payload" lines from got until done says so.
func waitDelivered(t *testing.T, got <-chan string, what string, done func(string) bool) {
	t.Helper()
	timeout := time.After(15 * time.Second)
	var seen []string
	for {
		select {
		case m := <-got:
			seen = append(seen, m)
			if done(m) {
				return
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s; delivered: %q", what, seen)
		}
	}
}
