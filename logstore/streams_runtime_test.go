package logstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// keysWithPrefix counts the keys starting with p.
func keysWithPrefix(tb testing.TB, st *Store, p []byte) int {
	tb.Helper()
	n := 0
	err := st.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: p})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("view: %v", err)
	}
	return n
}

func TestStore_AddStream(t *testing.T) {
	cfg := testConfig(t)
	st := openStore(t, cfg)
	def := st.Stream("default")
	appendN(t, def, 3, 3)
	if got := st.Route("sensors/a"); got != def {
		t.Fatalf("before: Route(sensors/a) = %v, want default", got)
	}

	s, err := st.AddStream(StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}, Durability: DurabilityFsync})
	if err != nil {
		t.Fatalf("AddStream: %v", err)
	}
	if st.Route("sensors/a") != s || st.Route("other") != def {
		t.Fatalf("after: sensors/a -> %v, other -> %v", st.Route("sensors/a"), st.Route("other"))
	}
	if st.Stream("sensors") != s || len(st.Streams()) != 2 || st.Streams()[1] != s {
		t.Fatalf("Stream/Streams do not list the added stream: %v", st.Streams())
	}
	if r := st.Reach("sensors/+"); len(r) != 1 || r[0] != s {
		t.Fatalf("Reach(sensors/+) = %v, want [sensors]", r)
	}
	if _, err := s.Append(context.Background(), rec("sensors/a", "x")); err != nil {
		t.Fatalf("Append to the added stream: %v", err)
	}
	if got := readAll(t, s, 0); len(got) != 1 || got[0].Topic != "sensors/a" {
		t.Fatalf("added stream holds %v", got)
	}

	t.Run("refuses what Open refuses", func(t *testing.T) {
		for _, sc := range []StreamConfig{
			{Name: "sensors", Filters: []string{"x/#"}},  // name taken
			{Name: "other", Filters: []string{"#"}},      // filter of default
			{Name: "bad name", Filters: []string{"y/#"}}, // invalid name
			{Name: "nofilter"},
		} {
			if _, err := st.AddStream(sc); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("AddStream(%+v) = %v, want ErrInvalidConfig", sc, err)
			}
		}
		if len(st.Streams()) != 2 {
			t.Fatalf("a refused AddStream changed the streams: %v", st.Streams())
		}
	})

	t.Run("config stays the source of truth at Open", func(t *testing.T) {
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st2 := openStore(t, cfg)
		if st2.Stream("sensors") != nil || st2.Route("sensors/a") != st2.Stream("default") {
			t.Fatalf("reopened store lists a stream its config does not")
		}
		if n := st2.Stream("default").NextOffset(); n != 3 {
			t.Fatalf("default NextOffset = %d after reopen, want 3", n)
		}
		s2, err := st2.AddStream(StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, s2, 0); len(got) != 1 || got[0].Topic != "sensors/a" {
			t.Fatalf("re-added stream holds %v, want its record back", got)
		}
		if s2.id == st2.Stream("default").id {
			t.Fatalf("re-added stream shares the default's id")
		}
	})
}

func TestStore_AddStreamDurabilityFixedAtOpen(t *testing.T) {
	st := openStore(t, testConfig(t, StreamConfig{Name: "default", Filters: []string{"#"}, Durability: DurabilityInterval, SyncInterval: time.Second}))
	for _, sc := range []StreamConfig{
		{Name: "f", Filters: []string{"f/#"}}, // fsync by default
		{Name: "i", Filters: []string{"i/#"}, Durability: DurabilityInterval, SyncInterval: time.Millisecond},
	} {
		if _, err := st.AddStream(sc); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("AddStream(%+v) = %v, want ErrInvalidConfig", sc, err)
		}
	}
	if _, err := st.AddStream(StreamConfig{Name: "i", Filters: []string{"i/#"}, Durability: DurabilityInterval, SyncInterval: 2 * time.Second}); err != nil {
		t.Fatalf("AddStream of an interval stream the sync loop serves: %v", err)
	}
}

func TestStore_RemoveStream(t *testing.T) {
	cfg := testConfig(t)
	st := openStore(t, cfg)
	def := st.Stream("default")
	s, err := st.AddStream(StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}})
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 2000, 100) // two chunks of stats
	if _, err := s.Append(context.Background(), rec("sensors/a", "x")); err != nil {
		t.Fatal(err)
	}
	id := s.id
	if keysWithPrefix(t, st, prefix(tagRecord, id)) == 0 {
		t.Fatal("no records stored")
	}

	if err := st.RemoveStream("sensors"); err != nil {
		t.Fatalf("RemoveStream: %v", err)
	}
	if st.Route("sensors/a") != def || st.Stream("sensors") != nil || len(st.Streams()) != 1 {
		t.Fatalf("removed stream still routed or listed")
	}
	if _, err := s.Read(0, 10, 0); !errors.Is(err, ErrStreamRemoved) || !errors.Is(err, ErrClosed) {
		t.Errorf("Read of a removed stream = %v, want ErrStreamRemoved and ErrClosed", err)
	}
	if _, err := s.ReadRaw(0, 10, 0); !errors.Is(err, ErrStreamRemoved) {
		t.Errorf("ReadRaw of a removed stream = %v, want ErrStreamRemoved", err)
	}
	if _, err := s.Append(context.Background(), rec("sensors/a", "y")); !errors.Is(err, ErrStreamRemoved) {
		t.Errorf("Append to a removed stream = %v, want ErrStreamRemoved", err)
	}
	if err := s.Wait(context.Background(), s.Committed()); !errors.Is(err, ErrStreamRemoved) {
		t.Errorf("Wait on a removed stream = %v, want ErrStreamRemoved", err)
	}
	for _, p := range [][]byte{prefix(tagRecord, id), prefix(tagChunk, id), prefix(tagEpoch, id), startKey(id), hwKey(id), streamIDKey("sensors")} {
		if n := keysWithPrefix(t, st, p); n != 0 {
			t.Errorf("%d keys left under %q", n, p)
		}
	}
	if err := st.RemoveStream("sensors"); !errors.Is(err, ErrUnknownStream) {
		t.Errorf("second RemoveStream = %v, want ErrUnknownStream", err)
	}
	if _, err := def.Append(context.Background(), rec("sensors/a", "z")); err != nil {
		t.Fatalf("append to the remaining stream: %v", err)
	}

	s2, err := st.AddStream(StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}})
	if err != nil {
		t.Fatal(err)
	}
	if s2.NextOffset() != 0 || s2.FirstOffset() != 0 {
		t.Fatalf("re-added stream starts at [%d, %d), want empty", s2.FirstOffset(), s2.NextOffset())
	}
}

// TestStore_RemoveStreamRefusesQueuedAppends holds the appender in a commit
// (the test takes the store's write lock), queues two more appends behind
// it, and removes the stream: the commit in progress ends, the queued
// appends fail with ErrStreamRemoved.
func TestStore_RemoveStreamRefusesQueuedAppends(t *testing.T) {
	st := openStore(t, testConfig(t))
	s, err := st.AddStream(StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	done := func(_ uint64, err error) { errs <- err }
	st.writeMu.Lock()
	s.AppendAsync([]*Record{rec("sensors/a", "1")}, done)
	testwait.Eventually(t, "the appender to take the first append", func() bool {
		s.q.Lock()
		defer s.q.Unlock()
		return len(s.q.reqs) == 0
	})
	s.AppendAsync([]*Record{rec("sensors/a", "2")}, done)
	s.AppendAsync([]*Record{rec("sensors/a", "3")}, done)
	removed := make(chan error, 1)
	go func() { removed <- st.RemoveStream("sensors") }()
	testwait.Eventually(t, "RemoveStream to mark the stream", s.removed.Load)
	st.writeMu.Unlock()
	if err := <-removed; err != nil {
		t.Fatalf("RemoveStream: %v", err)
	}
	if err := <-errs; err != nil {
		t.Errorf("append in commit: %v", err)
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrStreamRemoved) {
			t.Errorf("queued append = %v, want ErrStreamRemoved", err)
		}
	}
}

// TestStore_AddStreamUnderAppends adds streams while writers append by
// Route: every acknowledged record is in the stream it was routed to, and
// each stream holds only topics it wins at the time.
func TestStore_AddStreamUnderAppends(t *testing.T) {
	st := openStore(t, testConfig(t))
	type ack struct {
		s     *Stream
		off   uint64
		topic string
		after bool // routed after AddStream of its prefix returned
	}
	const writers, per = 4, 300
	var added sync.Map // prefix -> struct{} once AddStream returned
	acks := make([][]ack, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				p := fmt.Sprintf("p%d", i%3)
				_, after := added.Load(p)
				topic := fmt.Sprintf("%s/%d/%d", p, w, i)
				s := st.Route(topic)
				off, err := s.Append(context.Background(), rec(topic, "x"))
				if err != nil {
					t.Errorf("Append %s: %v", topic, err)
					return
				}
				acks[w] = append(acks[w], ack{s, off, topic, after})
			}
		}()
	}
	for _, p := range []string{"p1", "p2"} {
		if _, err := st.AddStream(StreamConfig{Name: p, Filters: []string{p + "/#"}}); err != nil {
			t.Fatal(err)
		}
		added.Store(p, struct{}{})
	}
	wg.Wait()

	byStream := map[*Stream]map[uint64]string{}
	for _, s := range st.Streams() {
		byStream[s] = map[uint64]string{}
		for _, r := range readAll(t, s, 0) {
			byStream[s][r.Offset] = r.Topic
		}
	}
	n := 0
	for _, as := range acks {
		for _, a := range as {
			n++
			if got := byStream[a.s][a.off]; got != a.topic {
				t.Fatalf("%s acked at %s@%d, which holds %q", a.topic, a.s.Name(), a.off, got)
			}
			if a.after && a.s.Name() != a.topic[:2] {
				t.Fatalf("%s routed to %s after its stream was added", a.topic, a.s.Name())
			}
		}
	}
	total := 0
	for _, m := range byStream {
		total += len(m)
	}
	if n != writers*per || total != n {
		t.Fatalf("acked %d, stored %d, want %d", n, total, writers*per)
	}
}

func TestStore_Watch(t *testing.T) {
	st := openStore(t, testConfig(t))
	events, cancel := st.Watch()
	defer cancel()
	next := func() StreamEvent {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("events closed")
			}
			return ev
		case <-time.After(30 * time.Second):
			t.Fatal("no event")
		}
		return StreamEvent{}
	}
	if ev := next(); ev.Kind != StreamAdded || ev.Stream != st.Stream("default") {
		t.Fatalf("first event %v %v, want added default", ev.Kind, ev.Stream)
	}
	// Nobody reads while the store changes: it must not wait.
	for i := range 20 {
		name := fmt.Sprintf("s%d", i)
		if _, err := st.AddStream(StreamConfig{Name: name, Filters: []string{name + "/#"}}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := st.RemoveStream(name); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 20 {
		name := fmt.Sprintf("s%d", i)
		if ev := next(); ev.Kind != StreamAdded || ev.Stream.Name() != name {
			t.Fatalf("event %v %s, want added %s", ev.Kind, ev.Stream.Name(), name)
		}
		if i%2 == 0 {
			if ev := next(); ev.Kind != StreamRemoved || ev.Stream.Name() != name {
				t.Fatalf("event %v %s, want removed %s", ev.Kind, ev.Stream.Name(), name)
			}
		}
	}
	cancel()
	cancel() // idempotent
	if _, ok := <-events; ok {
		t.Fatal("events not closed after cancel")
	}

	t.Run("Close ends watchers", func(t *testing.T) {
		st := openStore(t, testConfig(t))
		events, _ := st.Watch()
		<-events // added default
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		if _, ok := <-events; ok {
			t.Fatal("events not closed by Close")
		}
		if _, err := st.AddStream(StreamConfig{Name: "x", Filters: []string{"x"}}); !errors.Is(err, ErrClosed) {
			t.Fatalf("AddStream after Close = %v, want ErrClosed", err)
		}
		if ev, _ := st.Watch(); ev == nil {
			t.Fatal("Watch after Close returned nil")
		}
	})
}
