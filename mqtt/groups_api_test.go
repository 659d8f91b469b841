package mqtt

import (
	"context"
	"testing"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// A group committed from inside the node is stored in its stream, shown
// by $offsets, and followed by the group's MQTT consumer. Peat's own
// groups ($sink.<name>) are committed the same way, out of MQTT's reach.
func TestBroker_CommitGroup(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	store(t, s, topicsN("t", 0, 10), nil)
	b := newTestBroker(t, l)
	ctx := context.Background()
	if _, ok, _ := b.GroupOffset("reports", "default"); ok {
		t.Fatal("a new group has an offset")
	}
	watcher := dialRaw(t, b, "watcher", 5)
	watcher.Subscribe("$offsets/reports/default", 1)

	if err := b.CommitGroup(ctx, "reports", "default", 6); err != nil {
		t.Fatal(err)
	}
	if storedGroupOffset(l, "reports", "default") != "6" {
		t.Fatalf("stored offset %q, want 6", storedGroupOffset(l, "reports", "default"))
	}
	off, ok, changed := b.GroupOffset("reports", "default")
	if !ok || off != 6 {
		t.Fatalf("GroupOffset = %d %v, want 6", off, ok)
	}
	if pk := readPublishes(t, watcher, 1)[0]; string(pk.Payload) != "6" {
		t.Fatalf("$offsets shows %q, want 6", pk.Payload)
	}

	// A commit over MQTT (a consumer rewinding) is seen.
	admin := dialRaw(t, b, "admin", 5)
	admin.Publish("$offsets/reports/default", 1, 1, "2")
	testwait.Eventually(t, "the rewind to be seen", func() bool {
		select {
		case <-changed:
			off, _, _ := b.GroupOffset("reports", "default")
			return off == 2
		default:
			return false
		}
	})

	if err := b.CommitGroup(ctx, "$sink.cloud", "default", 3); err != nil {
		t.Fatal(err)
	}
	if off, ok, _ := b.GroupOffset("$sink.cloud", "default"); !ok || off != 3 {
		t.Fatalf("GroupOffset($sink.cloud) = %d %v, want 3", off, ok)
	}

	for _, bad := range []struct {
		group, stream string
		off           uint64
	}{{"a/b", "default", 1}, {"g", "nope", 1}, {"g", "default", 11}, {"", "default", 0}} {
		if err := b.CommitGroup(ctx, bad.group, bad.stream, bad.off); err == nil {
			t.Errorf("CommitGroup(%q, %q, %d) succeeded, want refused", bad.group, bad.stream, bad.off)
		}
	}
}
