package cluster

import (
	"context"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
)

// noLeak runs fn, which must stop everything it starts, and fails if the
// goroutine count does not come back to where it was.
func noLeak(t *testing.T, fn func(t *testing.T)) {
	t.Helper()
	before := runtime.NumGoroutine()
	fn(t)
	deadline := time.Now().Add(20 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			stacks := string(buf[:runtime.Stack(buf, true)])
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), stacks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReplication_StopsEverything(t *testing.T) {
	noLeak(t, func(t *testing.T) {
		lst, fst := openReplicaStore(t), openReplicaStore(t)
		ls, fs := lst.Stream("s"), fst.Stream("s")
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := Serve(ln, nil)
		leader := NewLeader("L", ls, 1, []string{"L", "F"}, nil)
		srv.Lead(leader)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- (&Fetcher{Self: "F", Stream: fs, LeaderAddr: srv.Addr(), LeaderEpoch: 1, Dial: TCPDialer, MaxWait: time.Minute}).Run(ctx)
		}()
		appendRecs(t, ls, 5, "a")
		eventually(t, "replicated", func() bool { return fs.Committed() == 5 })
		cancel() // with a fetch parked at the leader
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		leader.Close()
		if err := srv.Close(); err != nil && !strings.Contains(err.Error(), "closed") {
			t.Fatal(err)
		}
		for _, st := range []*logstore.Store{lst, fst} {
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestNode_StopsEverything(t *testing.T) {
	noLeak(t, func(t *testing.T) {
		s := startSite(t, partsOpts{})
		n := s.open("n1", nodeOpts{Expect: 1})
		s.controller([]*Node{n})
		s.registered([]*Node{n})
		s.kill(n)
	})
}
