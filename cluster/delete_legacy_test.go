package cluster

import (
	"context"
	"encoding/binary"
	"maps"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// A node upgraded from a Peat of key layout 3 keeps, in its own state,
// the positions of streams it does not list (a group's offset, a
// session's). When the site deletes such a stream, the node's copy goes
// with them: a stream created again under that name does not take them
// over at the next start, while those of other streams still move: a
// group's. A session's offsets are fenced by its claim, and the node's
// own sessions are none of the site's (no node claims them), so theirs
// are dropped, not left for a later session of that client id.
func TestSite_DeleteStreamForgetsLayout3Positions(t *testing.T) {
	a := newTestSite(t, siteOpts{Voters: 1, IDs: []string{"a"}, Streams: listed("keep", "old")}).nodes[0]
	eventually(t, "a leads old", func() bool { // an append before its Leader runs is refused
		_, _, here := a.StreamLeader("old")
		return a.Log.Stream("old") != nil && here
	})
	for range 5 {
		if _, err := logAppend(t, a.Log.Stream("old"), &logstore.Record{Topic: "old/x", QoS: 1}); err != nil {
			t.Fatal(err)
		}
	}
	a.stop(t)

	// What a layout 3 Peat left in the node's own state.
	store, err := logstore.Open(logstore.Config{Dir: a.dir + "/store", Profile: logstore.ProfilePiZero,
		Streams: []logstore.StreamConfig{{Name: "keep", Filters: []string{"keep/#"}}}, MinFreeBytes: -1, ManualCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := msgpack.Marshal(map[string]any{"v": 5, "e": 3600, "ef": true,
		"s": map[string]any{"old/#": map[string]any{"f": "old/#", "q": 1}, "keep/#": map[string]any{"f": "keep/#", "q": 1}},
		"o": map[string]uint64{"old": 3, "keep": 0}})
	if err != nil {
		t.Fatal(err)
	}
	offset := binary.BigEndian.AppendUint64(nil, 3)
	err = store.WriteState(map[string][]byte{"g/billing/old": offset, "g/billing/keep": offset, "s/dur": sess}, nil)
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	a.restart(t, listed("keep")...)
	waitLists(t, a, map[string][]string{"a": {"keep"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.DeleteStream(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deleted its copy of old", func() bool { return !stored(t, a, "old") })
	a.stop(t)

	// old created again: a broker starting on the site moves the old
	// positions it finds into their streams (mqtt's start).
	a.restart(t, listed("keep", "old")...)
	eventually(t, "a serves keep and the new old", func() bool {
		return a.Log.Stream("old") != nil && a.Log.Stream("keep") != nil
	})
	b, err := mqtt.New(mqtt.DefaultConfig(), a.Log)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	state := func(stream string) map[string]uint64 {
		t.Helper()
		got := map[string]uint64{}
		err := a.Log.Stream(stream).LoadState("", func(k string, v []byte) error {
			got[k] = binary.BigEndian.Uint64(v)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := state("old"); len(got) != 0 {
		t.Errorf("the new old's state holds %v, want no position of the deleted stream", got)
	}
	if got, want := state("keep"), map[string]uint64{"g/billing": 3}; !maps.Equal(got, want) {
		t.Errorf("keep's state holds %v, want the positions moved in %v", got, want)
	}
}
