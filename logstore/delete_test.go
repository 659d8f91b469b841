package logstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// keysOf counts the keys stored under stream id (records, chunk stats,
// epochs, stream state and meta keys) and whether a name maps to it.
func keysOf(tb testing.TB, st *Store, id uint32) int {
	tb.Helper()
	n := 0
	err := st.view(func(txn *badger.Txn) error {
		for _, p := range [][]byte{prefix(tagRecord, id), prefix(tagChunk, id), prefix(tagEpoch, id),
			prefix(tagStreamState, id), startKey(id), hwKey(id), incarnationKey(id)} {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: p})
			for it.Rewind(); it.Valid(); it.Next() {
				n++
			}
			it.Close()
		}
		ids, err := storedIDs(txn)
		for _, v := range ids {
			if v == id {
				n++
			}
		}
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func twoStreams(tb testing.TB) Config {
	return testConfig(tb, StreamConfig{Name: "old", Filters: []string{"old/#"}},
		StreamConfig{Name: "live", Filters: []string{"live/#"}})
}

// killDeleteEnv is "<dir> <step>": a re-executed test binary deletes
// stream old of the store in dir and stops after step, to be killed
// there (TestMain).
const killDeleteEnv = "PEAT_LOGSTORE_KILL_DELETE"

func killDeleteChild(spec string) {
	dir, step, _ := strings.Cut(spec, " ")
	st, err := Open(Config{Dir: dir, Profile: ProfilePiZero, MinFreeBytes: -1, RetentionInterval: time.Hour,
		Streams: []StreamConfig{{Name: "live", Filters: []string{"live/#"}}}})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	st.deleteHook = func(s string) error {
		if s == step {
			fmt.Println("stopped")
			select {} // killed here
		}
		return nil
	}
	fmt.Println("error: the deletion ended:", st.DeleteStream("old"))
	os.Exit(2)
}

// fillOld writes records, a group offset and leader epochs to "old" and a
// few records to "live"; it returns old's id.
func fillOld(tb testing.TB, cfg Config, n int) uint32 {
	tb.Helper()
	st, err := Open(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	old := st.Stream("old")
	old.SetEpoch(3)
	appendN(tb, old, n, 500)
	if err := old.WriteState(map[string][]byte{"group/billing": []byte("12")}, nil); err != nil {
		tb.Fatal(err)
	}
	appendN(tb, st.Stream("live"), 10, 10)
	id := old.id
	if err := st.Close(); err != nil {
		tb.Fatal(err)
	}
	return id
}

// A stream the configuration no longer lists is shown by Unlisted and
// deleted by DeleteStream alone: every key of it goes, the other stream
// keeps taking appends meanwhile, and a stream of the same name later
// starts empty at 0 with no group offset.
func TestStore_DeleteStream(t *testing.T) {
	cfg := twoStreams(t)
	id := fillOld(t, cfg, 3000)

	cfg.Streams = cfg.Streams[1:] // "old" left out: still on disk
	st := openStore(t, cfg)
	un, err := st.Unlisted()
	if err != nil {
		t.Fatal(err)
	}
	if len(un) != 1 || un[0].Name != "old" || un[0].FirstOffset != 0 || un[0].NextOffset != 3000 || un[0].Bytes <= 0 {
		t.Fatalf("Unlisted = %+v, want old with offsets 0-3000 and its bytes", un)
	}
	if err := st.DeleteStream("live"); !errors.Is(err, ErrStreamListed) {
		t.Fatalf("DeleteStream(live) = %v, want ErrStreamListed", err)
	}
	if err := st.DeleteStream("nope"); !errors.Is(err, ErrUnknownStream) {
		t.Fatalf("DeleteStream(nope) = %v, want ErrUnknownStream", err)
	}

	live := st.Stream("live")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var appended atomic.Int64
	var appendErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := live.Append(context.Background(), rec("live/a", "x")); err != nil {
				appendErr.Store(err)
				return
			}
			appended.Add(1)
		}
	}()
	// Each block's DropPrefix holds the writers off; appends must pass
	// between them, while the deletion is under way.
	var stalled atomic.Bool
	st.deleteHook = func(step string) error {
		if step != "block" {
			return nil
		}
		at := appended.Load()
		for deadline := time.Now().Add(10 * time.Second); appended.Load() == at && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		stalled.Store(appended.Load() == at)
		return nil
	}
	if err := st.DeleteStream("old"); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if err, _ := appendErr.Load().(error); err != nil {
		t.Fatalf("an append to live failed during the deletion: %v", err)
	}
	if stalled.Load() {
		t.Fatal("appends to live stopped while old was being deleted")
	}
	if n := keysOf(t, st, id); n != 0 {
		t.Fatalf("%d keys of the deleted stream left", n)
	}
	if un, _ := st.Unlisted(); len(un) != 0 {
		t.Fatalf("Unlisted after the deletion = %+v", un)
	}
	if err := st.DeleteStream("old"); !errors.Is(err, ErrUnknownStream) {
		t.Fatalf("DeleteStream(old) again = %v, want ErrUnknownStream", err)
	}
	if got := readAll(t, live, 0); len(got) != 10+int(appended.Load()) {
		t.Fatalf("live holds %d records, want %d", len(got), 10+appended.Load())
	}

	// The same name again: a new, empty stream.
	s, err := st.AddStream(StreamConfig{Name: "old", Filters: []string{"old/#"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.FirstOffset() != 0 || s.NextOffset() != 0 || s.id == id {
		t.Fatalf("re-created old: offsets %d-%d, id %d (deleted id %d)", s.FirstOffset(), s.NextOffset(), s.id, id)
	}
	if _, _, ok := s.LatestEpoch(); ok {
		t.Fatal("re-created old has the deleted stream's leader epochs")
	}
	n := 0
	if err := s.LoadState("", func(string, []byte) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("re-created old has %d state entries (%v)", n, err)
	}
	if first := appendN(t, s, 1, 1); first != 0 {
		t.Fatalf("first append to the re-created stream at %d, want 0", first)
	}
}

// A deletion stopped after any of its steps (as a kill -9 would stop it)
// is finished by the next Open: the stream is gone whole, and a stream of
// that name starts empty, never with the old records.
func TestStore_DeleteStreamInterrupted(t *testing.T) {
	for _, step := range []string{"tombstone", "block", "keys"} {
		t.Run(step, func(t *testing.T) {
			cfg := twoStreams(t)
			id := fillOld(t, cfg, 70_000) // two blocks
			listed := cfg.Streams
			cfg.Streams = cfg.Streams[1:]
			st, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			crash := errors.New("crash")
			st.deleteHook = func(s string) error {
				if s == step {
					return crash
				}
				return nil
			}
			if err := st.DeleteStream("old"); !errors.Is(err, crash) {
				t.Fatalf("DeleteStream = %v, want the crash", err)
			}
			if un, _ := st.Unlisted(); len(un) != 0 {
				t.Fatalf("Unlisted after an interrupted deletion = %+v: the name must be gone at once", un)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}

			cfg.Streams = listed // listed again: it must not come back
			st = openStore(t, cfg)
			if n := keysOf(t, st, id); n != 0 {
				t.Fatalf("%d keys of the deleted stream left after Open", n)
			}
			s := st.Stream("old")
			if s.FirstOffset() != 0 || s.NextOffset() != 0 {
				t.Fatalf("old after Open: offsets %d-%d, want an empty stream", s.FirstOffset(), s.NextOffset())
			}
			if first := appendN(t, s, 5, 5); first != 0 {
				t.Fatalf("first append at %d, want 0", first)
			}
			if got := readAll(t, s, 0); len(got) != 5 || got[0].Topic != "t/0" {
				t.Fatalf("old holds %d records after re-creation, want the 5 new ones", len(got))
			}
			if got := readAll(t, st.Stream("live"), 0); len(got) != 10 {
				t.Fatalf("live holds %d records, want 10", len(got))
			}
		})
	}
}

// A process killed with SIGKILL in the middle of a deletion leaves the
// stream whole-gone at the next Open: a stream of that name starts empty.
func TestStore_DeleteStreamKilled(t *testing.T) {
	for _, step := range []string{"tombstone", "block"} {
		t.Run(step, func(t *testing.T) {
			cfg := twoStreams(t)
			id := fillOld(t, cfg, 70_000)
			args := []string{os.Args[0], "-test.run=^$"}
			if emu := os.Getenv(testExecEnv); emu != "" {
				args = append([]string{emu}, args...)
			}
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Env = append(os.Environ(), killDeleteEnv+"="+cfg.Dir+" "+step)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil || line != "stopped\n" {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("child said %q, %v; want stopped", line, err)
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()

			st := openStore(t, cfg) // old listed again
			if n := keysOf(t, st, id); n != 0 {
				t.Fatalf("%d keys of the deleted stream left after Open", n)
			}
			if s := st.Stream("old"); s.NextOffset() != 0 || s.FirstOffset() != 0 {
				t.Fatalf("old after the kill: offsets %d-%d, want an empty stream", s.FirstOffset(), s.NextOffset())
			}
			if got := readAll(t, st.Stream("live"), 0); len(got) != 10 {
				t.Fatalf("live holds %d records, want 10", len(got))
			}
		})
	}
}

// Deleting a stream gives its disk space back: its value-log files go.
func TestStore_DeleteStreamGivesSpaceBack(t *testing.T) {
	cfg := twoStreams(t)
	cfg.Streams[0].Durability, cfg.Streams[1].Durability = DurabilityInterval, DurabilityInterval
	cfg.tune = func(p *profileSpec) { p.valueThreshold, p.valueLogFileSize = 64, 1*mib }
	st, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 1024)
	for i := range 16 {
		recs := make([]*Record, 1000)
		for j := range recs {
			recs[j] = &Record{Topic: "old/x", Payload: payload, QoS: 1}
		}
		if _, err := st.Stream("old").Append(context.Background(), recs...); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Stream("live").Append(context.Background(), rec("live/a", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.Streams = cfg.Streams[1:]
	st = openStore(t, cfg)
	if err := st.db.Flatten(1); err != nil { // tables below level 0: DropPrefix may skip reading them
		t.Fatal(err)
	}
	before := vlogBytes(t, cfg.Dir)
	if err := st.DeleteStream("old"); err != nil {
		t.Fatal(err)
	}
	after := vlogBytes(t, cfg.Dir)
	t.Logf("value log: %d KiB before, %d KiB after", before>>10, after>>10)
	if before < 12*mib || after > 3*mib {
		t.Fatalf("value log %d bytes before the deletion, %d after: want 16 MiB of records given back to at most 3 MiB",
			before, after)
	}
	if got := readAll(t, st.Stream("live"), 0); len(got) != 16 {
		t.Fatalf("live holds %d records, want 16", len(got))
	}
}

// ResetStream empties a served stream under the same name, recording the
// incarnation, and the old records never come back.
func TestStore_ResetStream(t *testing.T) {
	cfg := testConfig(t)
	cfg.ManualCommit = true
	st := openStore(t, cfg)
	s := st.Stream("default")
	if err := s.SetIncarnation(4); err != nil {
		t.Fatal(err)
	}
	s.SetEpoch(2)
	appendN(t, s, 100, 10)
	if _, _, ok := s.LatestEpoch(); !ok {
		t.Fatal("no leader epoch recorded")
	}
	if err := s.SetHighWatermark(context.Background(), 100); err != nil {
		t.Fatal(err)
	}
	events, cancel := st.Watch()
	defer cancel()
	<-events // Added for the stream there
	ns, err := st.ResetStream("default", 9)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-events; ev.Kind != StreamRemoved || ev.Stream != s {
		t.Fatalf("first event %+v, want the old stream removed", ev)
	}
	if ev := <-events; ev.Kind != StreamAdded || ev.Stream != ns {
		t.Fatalf("second event %+v, want the new stream added", ev)
	}
	if ns.NextOffset() != 0 || ns.Committed() != 0 || ns.Incarnation() != 9 || st.Stream("default") != ns {
		t.Fatalf("reset stream: next %d, committed %d, incarnation %d", ns.NextOffset(), ns.Committed(), ns.Incarnation())
	}
	if _, err := s.Read(0, 1, 0); !errors.Is(err, ErrStreamRemoved) {
		t.Fatalf("Read on the old *Stream = %v, want ErrStreamRemoved", err)
	}
	if _, _, ok := ns.LatestEpoch(); ok {
		t.Fatal("the reset stream has the old one's leader epochs")
	}
}
