package rules

import (
	"errors"
	"testing"
)

// A deletion is refused while a broker's configuration lists the stream,
// leaves a tombstone naming the incarnation deleted, and a stream created
// again under the name is another incarnation.
func TestState_DeleteStream(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	ft.ok(CreateStream{Name: "old", Replicas: []string{"a", "b", "c"}})
	ft.ok(CreateStream{Name: "keep", Replicas: []string{"a", "b", "c"}})
	st, _ := ft.f.State()
	first := st.Streams["old"].Created
	if first == 0 || st.Streams["keep"].Created == first {
		t.Fatalf("creations %d and %d: want distinct, above 0", first, st.Streams["keep"].Created)
	}
	ft.ok(ListStreams{ID: "a", Epoch: 1, Names: []string{"old", "keep"}})
	ft.refused(ListStreams{ID: "b", Epoch: 2, Names: []string{"keep"}}, ErrStaleBrokerEpoch)
	ft.refused(DeleteStream{Name: "old"}, ErrStreamListed)
	ft.ok(ListStreams{ID: "a", Epoch: 1, Names: []string{"keep"}})
	ft.refused(DeleteStream{Name: "old", Created: first + 7}, ErrUnknownStream)
	ft.refused(DeleteStream{Name: "nope"}, ErrUnknownStream)
	ft.ok(DeleteStream{Name: "old", Created: first})
	st, _ = ft.f.State()
	if st.Streams["old"] != nil || st.Deleted["old"] != first || st.Streams["keep"] == nil {
		t.Fatalf("after the deletion: streams %v, tombstones %v", st.StreamNames(), st.Deleted)
	}
	ft.refused(DeleteStream{Name: "old"}, ErrUnknownStream)

	ft.ok(CreateStream{Name: "old", Replicas: []string{"b", "c"}})
	st, _ = ft.f.State()
	if again := st.Streams["old"].Created; again <= first {
		t.Fatalf("created again as incarnation %d, want above %d", again, first)
	}

	// The tombstones and incarnations survive a snapshot.
	st2, _ := roundTrip(t, ft.f).State()
	if st2.Deleted["old"] != first || st2.Incarnations != st.Incarnations || st2.Streams["old"].Created != st.Streams["old"].Created {
		t.Fatalf("restored: tombstones %v, incarnations %d", st2.Deleted, st2.Incarnations)
	}
	if _, err := DecodeCommand([]byte{99}); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("unknown kind: %v", err)
	}
}
