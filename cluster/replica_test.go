package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
)

// openReplica opens a store whose stream "s" is a replica: the high
// watermark moves only by SetHighWatermark (ManualCommit).
func openReplica(tb testing.TB) *logstore.Stream {
	tb.Helper()
	return openReplicaStore(tb).Stream("s")
}

func openReplicaStore(tb testing.TB) *logstore.Store {
	tb.Helper()
	st, err := logstore.Open(logstore.Config{
		Dir:               tb.TempDir(),
		Profile:           logstore.ProfilePiZero,
		Streams:           []logstore.StreamConfig{{Name: "s", Filters: []string{"#"}}},
		RetentionInterval: time.Hour,
		MinFreeBytes:      -1,
		ManualCommit:      true,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

func appendRecs(tb testing.TB, s *logstore.Stream, n int, tag string) {
	tb.Helper()
	recs := make([]*logstore.Record, n)
	for i := range recs {
		recs[i] = &logstore.Record{Topic: "t/" + tag, Payload: []byte(fmt.Sprintf("%s-%d", tag, i)), QoS: 1}
	}
	if _, err := s.Append(context.Background(), recs...); err != nil {
		tb.Fatal(err)
	}
}

// sameLog checks that b holds exactly a's record values.
func sameLog(tb testing.TB, a, b *logstore.Stream) {
	tb.Helper()
	if a.NextOffset() != b.NextOffset() {
		tb.Fatalf("log ends %d and %d", a.NextOffset(), b.NextOffset())
	}
	va, err := a.ReadRaw(a.FirstOffset(), 0, 0)
	if err != nil {
		tb.Fatal(err)
	}
	vb, err := b.ReadRaw(a.FirstOffset(), 0, 0)
	if err != nil {
		tb.Fatal(err)
	}
	for i := range va {
		if !bytes.Equal(va[i], vb[i]) {
			tb.Fatalf("offset %d differs", a.FirstOffset()+uint64(i))
		}
	}
}

// countingDialer dials TCP and counts the frames written on its connections.
type countingDialer struct{ frames atomic.Int64 }

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) { c.n.Add(1); return c.Conn.Write(p) }

func (d *countingDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := TCPDialer(ctx, addr)
	if err != nil {
		return nil, err
	}
	return countingConn{c, &d.frames}, nil
}

func serve(tb testing.TB) *Server {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := Serve(ln, nil)
	tb.Cleanup(func() { _ = srv.Close() })
	return srv
}

func lead(tb testing.TB, srv *Server, s *logstore.Stream, epoch uint32, isr ...string) *Leader {
	tb.Helper()
	l := NewLeader("L", s, epoch, isr, nil)
	tb.Cleanup(l.Close)
	srv.Lead(l)
	return l
}

// runFetcher runs f until the test ends, and returns its result channel.
func runFetcher(tb testing.TB, f *Fetcher) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- f.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		<-res
	})
	return res
}

func TestReplication_FollowerCatchesUpAndTheWatermarkWaitsForTheISR(t *testing.T) {
	ls, fs := openReplica(t), openReplica(t)
	srv := serve(t)
	leader := lead(t, srv, ls, 1, "L", "F")

	appendRecs(t, ls, 100, "a")
	leader.SetISR([]string{"L", "F"}) // moves the watermark now, if it can
	if hw := ls.Committed(); hw != 0 {
		t.Fatalf("leader's watermark %d before the follower fetched, want 0", hw)
	}

	var d countingDialer
	runFetcher(t, &Fetcher{Self: "F", BrokerEpoch: 1, Stream: fs, LeaderAddr: srv.Addr(), LeaderEpoch: 1,
		Dial: d.dial, MaxWait: 20 * time.Second, MaxBytes: 1024})
	eventually(t, "the follower has everything and both watermarks are at the end", func() bool {
		return fs.NextOffset() == 100 && ls.Committed() == 100 && fs.Committed() == 100
	})
	sameLog(t, ls, fs)
	if e, _, _ := fs.LatestEpoch(); e != 1 {
		t.Fatalf("follower's latest epoch %d, want the leader's 1", e)
	}

	// Caught up, the follower's fetch waits at the leader (the long poll):
	// a few frames, not a busy loop, and the next record arrives at once.
	time.Sleep(300 * time.Millisecond)
	before := d.frames.Load()
	appendRecs(t, ls, 1, "b")
	eventually(t, "the new record is replicated and committed", func() bool {
		return fs.NextOffset() == 101 && ls.Committed() == 101 && fs.Committed() == 101
	})
	if n := d.frames.Load() - before; n > 3 {
		t.Fatalf("%d fetch frames for one record after catching up: not a long poll", n)
	}
	sameLog(t, ls, fs)

	// Out of the ISR, the follower no longer holds the watermark back.
	leader.SetISR([]string{"L"})
	appendRecs(t, ls, 1, "c")
	eventually(t, "a lone leader commits its own appends", func() bool { return ls.Committed() == 102 })
}

func TestReplication_FollowerTruncatesToTheLeadersEpochEnd(t *testing.T) {
	ls, fs := openReplica(t), openReplica(t)
	// The follower led in epoch 1 and wrote 10 records; 5 were committed.
	fs.SetEpoch(1)
	appendRecs(t, fs, 10, "old")
	if err := fs.SetHighWatermark(context.Background(), 5); err != nil {
		t.Fatal(err)
	}
	// The new leader had replicated 7 of them, then led epoch 2.
	vals, err := fs.ReadRaw(0, 7, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.AppendReplica(context.Background(), 0, vals); err != nil {
		t.Fatal(err)
	}
	srv := serve(t)
	lead(t, srv, ls, 2, "L", "F")
	appendRecs(t, ls, 5, "new") // offsets 7-11, epoch 2

	runFetcher(t, &Fetcher{Self: "F", BrokerEpoch: 1, Stream: fs, LeaderAddr: srv.Addr(), LeaderEpoch: 2, Dial: TCPDialer})
	eventually(t, "the follower matches the leader", func() bool {
		return fs.NextOffset() == 12 && fs.Committed() == 12 && ls.Committed() == 12
	})
	sameLog(t, ls, fs)
	recs, err := fs.Read(7, 1, 0)
	if err != nil || len(recs) != 1 || string(recs[0].Payload) != "new-0" || recs[0].Epoch != 2 {
		t.Fatalf("follower's offset 7 = %+v, %v; want the new leader's record of epoch 2", recs, err)
	}
	if e, end, ok := fs.EndOffsetForEpoch(1); !ok || e != 1 || end != 7 {
		t.Fatalf("follower's epoch 1 ends at %d (%d, %v), want 7", end, e, ok)
	}
}

func TestReplication_StaleViewsAreRefused(t *testing.T) {
	ls, fs := openReplica(t), openReplica(t)
	srv := serve(t)
	lead(t, srv, ls, 3, "L", "F")
	appendRecs(t, ls, 3, "a")

	run := func(epoch uint32, stream *logstore.Stream) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return (&Fetcher{Self: "F", BrokerEpoch: 1, Stream: stream, LeaderAddr: srv.Addr(), LeaderEpoch: epoch, Dial: TCPDialer}).Run(ctx)
	}
	if err := run(2, fs); !errors.Is(err, ErrFenced) || !errors.Is(err, wire.FencedLeaderEpoch) {
		t.Fatalf("fetch with an old leader epoch = %v, want ErrFenced with FencedLeaderEpoch", err)
	}
	if fs.NextOffset() != 0 {
		t.Fatal("a fenced fetcher appended records")
	}
	srv.Resign("s")
	if err := run(3, fs); !errors.Is(err, ErrFenced) || !errors.Is(err, wire.NotLeader) {
		t.Fatalf("fetch from a node that resigned = %v, want ErrFenced with NotLeader", err)
	}

	// A leader epoch newer than the leader knows: the follower waits for
	// the leader to catch up with the controller, fetching nothing.
	l4 := NewLeader("L", ls, 3, []string{"L", "F"}, nil)
	defer l4.Close()
	srv.Lead(l4)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := (&Fetcher{Self: "F", Stream: fs, LeaderAddr: srv.Addr(), LeaderEpoch: 4, Dial: TCPDialer}).Run(ctx)
	if err != nil || fs.NextOffset() != 0 {
		t.Fatalf("fetch with a newer leader epoch = %v, %d records; want a retry until cancelled, none", err, fs.NextOffset())
	}
}

// Over the fault network: a partitioned follower holds the watermark
// (acks=all) until the leader sees it lag and the ISR drops it; healed, it
// catches up, is a joiner again, and nothing diverges. A dropped
// connection and a slow link change nothing either.
// netLeader serves a Leader "L" of a new replica over a new faultnet
// network, with its ISR L and F, and returns the network, the leader's
// replica and a follower replica for F's Fetcher.
func netLeader(t *testing.T) (fn *faultnet.Network, leader *Leader, ls, fs *logstore.Stream) {
	t.Helper()
	fn = faultnet.New()
	ln, err := fn.Listen("L")
	if err != nil {
		t.Fatal(err)
	}
	srv := Serve(ln, nil)
	t.Cleanup(func() { _ = srv.Close() })
	ls, fs = openReplica(t), openReplica(t)
	return fn, lead(t, srv, ls, 1, "L", "F"), ls, fs
}

func TestReplication_PartitionLagAndRejoin(t *testing.T) {
	fn, leader, ls, fs := netLeader(t)
	runFetcher(t, &Fetcher{Self: "F", BrokerEpoch: 7, Stream: fs, LeaderAddr: "L", LeaderEpoch: 1,
		Dial: fn.Dialer("F"), MaxWait: 200 * time.Millisecond, Timeout: 300 * time.Millisecond})

	appendRecs(t, ls, 50, "a")
	eventually(t, "replicated and committed", func() bool { return fs.Committed() == 50 && ls.Committed() == 50 })

	fn.Partition("L", "F")
	appendRecs(t, ls, 10, "b")
	leader.SetISR([]string{"L", "F"})
	if hw := ls.Committed(); hw != 50 {
		t.Fatalf("watermark %d with a partitioned ISR member, want 50", hw)
	}
	lag := 300 * time.Millisecond
	eventually(t, "the leader sees F lag", func() bool {
		got := leader.Laggards(time.Now(), lag, 0)
		return len(got) == 1 && got[0] == "F"
	})
	leader.SetISR([]string{"L"}) // as the controller would commit it
	if hw := ls.Committed(); hw != 60 {
		t.Fatalf("watermark %d once F left the ISR, want 60", hw)
	}

	fn.Heal("L", "F")
	fn.Delay("L", "F", 20*time.Millisecond)
	appendRecs(t, ls, 10, "c")
	eventually(t, "F catches up over a slow link", func() bool { return fs.NextOffset() == 70 && fs.Committed() == 70 })
	if got := leader.Joiners(); len(got) != 1 || got[0] != (rules.ISRMember{ID: "F", Epoch: 7}) {
		t.Fatalf("joiners = %v, want F in its epoch 7", got)
	}
	// A replica that lacks the Log's consumer state does not rejoin.
	var rs replState
	rs.changed = make(chan struct{})
	rs.reset(leader)
	if got := leader.Joiners(); len(got) != 0 {
		t.Fatalf("joiners = %v before F acknowledged the leader's state, want none", got)
	}
	rs.mu.Lock()
	rs.caught["F"] = true // as its state fetches would have it
	rs.mu.Unlock()
	if got := leader.Joiners(); len(got) != 1 || got[0].ID != "F" {
		t.Fatalf("joiners = %v once F holds the state, want F", got)
	}
	fn.Drop("L", "F")
	appendRecs(t, ls, 10, "d")
	eventually(t, "F reconnects and goes on", func() bool { return fs.NextOffset() == 80 && fs.Committed() == 80 })
	sameLog(t, ls, fs)
}

// TestReplication_SilentConnectionIsReplaced: the fetch connection goes
// silent (its bytes held one way, as a connection that lived through a
// cut holds them until TCP's next retransmission) while a new one would
// connect. The follower gives it up for a new connection and catches up
// long before the fetch timeout, whichever way the connection stalls.
func TestReplication_SilentConnectionIsReplaced(t *testing.T) {
	for _, dir := range []struct{ name, from, to string }{
		{"answers held", "L", "F"},
		{"requests held", "F", "L"},
	} {
		t.Run(dir.name, func(t *testing.T) {
			fn, _, ls, fs := netLeader(t)
			const stall = 20 * time.Second
			// The fetch timeout is past the stall: only giving the silent
			// connection up early lets the follower catch up within it.
			runFetcher(t, &Fetcher{Self: "F", BrokerEpoch: 1, Stream: fs, LeaderAddr: "L", LeaderEpoch: 1,
				Dial: fn.Dialer("F"), MaxWait: 200 * time.Millisecond, Timeout: 2 * stall})
			appendRecs(t, ls, 10, "a")
			eventually(t, "replicated and committed", func() bool { return fs.Committed() == 10 && ls.Committed() == 10 })

			start := time.Now()
			fn.Stall(dir.from, dir.to, stall)
			appendRecs(t, ls, 10, "b")
			for fs.NextOffset() < 20 || fs.Committed() < 20 {
				if time.Since(start) > stall/2 {
					t.Fatalf("the follower holds %d records, committed %d, %v into the stall of its connection: it waits for the silent one",
						fs.NextOffset(), fs.Committed(), time.Since(start))
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("caught up %v into the stall", time.Since(start).Round(time.Millisecond))
			sameLog(t, ls, fs)
		})
	}
}

// TestReplication_SlowLinkIsNotSilence: every answer of the leader takes
// longer than the silence a fetch is allowed (a slow link, not a dead
// connection). The follower gives a connection up at most once or twice
// and then waits: it keeps catching up rather than starting over.
func TestReplication_SlowLinkIsNotSilence(t *testing.T) {
	fn, _, ls, fs := netLeader(t)
	fn.Delay("L", "F", 400*time.Millisecond)
	var dials atomic.Int64
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := fn.Dialer("F")(ctx, addr)
		if err == nil {
			dials.Add(1)
		}
		return c, err
	}
	runFetcher(t, &Fetcher{Self: "F", BrokerEpoch: 1, Stream: fs, LeaderAddr: "L", LeaderEpoch: 1,
		Dial: dial, MaxWait: 50 * time.Millisecond, Timeout: 5 * time.Second, silentAfter: 200 * time.Millisecond})
	for i := range 5 {
		appendRecs(t, ls, 10, fmt.Sprint("b", i))
		want := uint64(10 * (i + 1))
		eventually(t, "caught up over the slow link", func() bool { return fs.NextOffset() == want })
	}
	if n := dials.Load(); n > 3 {
		t.Fatalf("%d connections for 5 fetches over a slow link: given up again and again", n)
	}
	sameLog(t, ls, fs)
}
