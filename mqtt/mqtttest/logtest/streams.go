package logtest

import (
	"errors"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// nextEvent waits for the next stream event.
func nextEvent(t *testing.T, events <-chan mqtt.StreamEvent) mqtt.StreamEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatal("WatchStreams: channel closed early")
		}
		return ev
	case <-time.After(Deadline):
		t.Fatalf("WatchStreams: no event within %v", Deadline)
		return mqtt.StreamEvent{}
	}
}

// wantEvent checks an event's kind and stream name.
func wantEvent(t *testing.T, ev mqtt.StreamEvent, kind logstore.StreamEventKind, name string) {
	t.Helper()
	if ev.Kind != kind || ev.Stream == nil || ev.Stream.Name() != name {
		t.Fatalf("event %v %v, want %v %s", ev.Kind, ev.Stream, kind, name)
	}
}

// wantClosed waits for events to close.
func wantClosed(t *testing.T, events <-chan mqtt.StreamEvent) {
	t.Helper()
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-time.After(Deadline):
			t.Fatalf("WatchStreams: channel not closed within %v", Deadline)
		}
	}
}

// testWatchStreams: the first events are an Added per stream, in Streams
// order; cancel closes the channel and may be called twice; closing the
// log closes a channel not cancelled.
func testWatchStreams(t *testing.T, s Suite) {
	l, closeLog := s.open(t, "a=a/#", "b=b/#")
	events, cancel := l.WatchStreams()
	wantEvent(t, nextEvent(t, events), logstore.StreamAdded, "a")
	ev := nextEvent(t, events)
	wantEvent(t, ev, logstore.StreamAdded, "b")
	if l.Route("b/x") != ev.Stream {
		t.Errorf("the event's stream is not the one Route returns")
	}
	cancel()
	cancel()
	wantClosed(t, events)

	events, _ = l.WatchStreams()
	if err := closeLog(); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, events)
}

// testStreamChanges: an added stream is routed to and announced; a removed
// one is announced, no longer routed to (its topics fall to the next
// matching stream), and behaves as closed; events wait for a watcher that
// does not read.
func testStreamChanges(t *testing.T, s Suite) {
	l, _ := s.open(t, "default=#")
	events, cancel := l.WatchStreams()
	defer cancel()
	def := l.Route("sensors/a")
	s.AddStream(t, l, "sensors=sensors/#")
	s.AddStream(t, l, "meters=meters/+")
	s.RemoveStream(t, l, "meters")
	wantEvent(t, nextEvent(t, events), logstore.StreamAdded, "default")
	added := nextEvent(t, events)
	wantEvent(t, added, logstore.StreamAdded, "sensors")
	wantEvent(t, nextEvent(t, events), logstore.StreamAdded, "meters")
	wantEvent(t, nextEvent(t, events), logstore.StreamRemoved, "meters")

	sensors := added.Stream
	if l.Stream("sensors") != sensors {
		t.Fatalf("Stream(sensors) is not the added stream")
	}
	if l.Route("sensors/a") != sensors || l.Route("meters/x") != def || len(l.Streams()) != 2 {
		t.Fatalf("after changes: sensors/a -> %v, meters/x -> %v, %d streams", l.Route("sensors/a"), l.Route("meters/x"), len(l.Streams()))
	}
	if off := mustAppend(t, sensors, rec("sensors/a", 100)); off != 0 {
		t.Fatalf("first offset of an added stream = %d, want 0", off)
	}
	if err := sensors.WriteState(map[string][]byte{"g/x": []byte("1")}, nil); err != nil {
		t.Fatalf("WriteState of an added stream: %v", err)
	}

	s.RemoveStream(t, l, "sensors")
	wantEvent(t, nextEvent(t, events), logstore.StreamRemoved, "sensors")
	if l.Route("sensors/a") != def {
		t.Fatalf("a removed stream's topic is not routed to the next matching stream")
	}
	for _, st := range l.Streams() {
		if st.Name() == "sensors" {
			t.Fatal("Streams lists a removed stream")
		}
	}
	if got := l.Stream("sensors"); got != nil {
		t.Fatalf("Stream of a removed stream = %#v, want a nil interface", got)
	}
	if r := appendWait(t, sensors, rec("sensors/a", 100)); !errors.Is(r.err, logstore.ErrClosed) {
		t.Errorf("append to a removed stream = %v, want ErrClosed", r.err)
	}
	if _, err := sensors.Read(0, 0, 0); !errors.Is(err, logstore.ErrClosed) {
		t.Errorf("read of a removed stream = %v, want ErrClosed", err)
	}
	select {
	case <-sensors.Changed():
	case <-time.After(Deadline):
		t.Errorf("Changed of a removed stream is not closed")
	}
	if err := sensors.LoadState("", func(string, []byte) error { return nil }); !errors.Is(err, logstore.ErrClosed) {
		t.Errorf("LoadState of a removed stream = %v, want ErrClosed", err)
	}
	// A stream of the same name added again starts afresh: no records, no
	// consumer positions of the one removed.
	s.AddStream(t, l, "sensors=sensors/#")
	wantEvent(t, nextEvent(t, events), logstore.StreamAdded, "sensors")
	again := l.Stream("sensors")
	if m := stateOf(t, again); len(m) != 0 {
		t.Errorf("a re-added stream has the removed one's state %v", m)
	}
	if again.Committed() != 0 {
		t.Errorf("a re-added stream starts at %d, want 0", again.Committed())
	}
}

// stateOf returns every entry of st.
func stateOf(t *testing.T, st mqtt.StateStore) map[string]string {
	t.Helper()
	m, _ := loadState(t, st, "")
	return m
}
