package cluster

import (
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
)

// TestSite_SilentStateFetchConnectionIsReplaced: the connections open
// between a follower and the stream's leader stall, one way (what they
// carry is held, as by TCP's retransmission backoff after a cut, while
// new connections flow). The leader answers a state write once every ISR
// member's state fetch holds it, so the write waits for the follower's
// state fetch: the silent connection is given up for a new one, and the
// write answered, long before the state fetch timeout, set here past the
// stall (and the ISR's lag allowance with it, so that the follower stays
// in the ISR: only the new connection can answer the write in time).
func TestSite_SilentStateFetchConnectionIsReplaced(t *testing.T) {
	const stall = 20 * time.Second
	for _, dir := range []struct {
		name     string
		toLeader bool
	}{
		{"answers held", false},
		{"requests held", true},
	} {
		t.Run(dir.name, func(t *testing.T) {
			fnet := faultnet.New()
			leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 3, LagMax: 2 * stall, StateFetchTimeout: 2 * stall})
			fl := others[1] // not the controller: its heartbeats do not cross the stall
			s := leader.Log.Stream("s")
			if err := s.WriteState(map[string][]byte{"g": []byte("1")}, nil); err != nil {
				t.Fatal(err)
			}
			eventually(t, fl.Node.ID()+" to hold the first write", func() bool { return string(loadKey(t, fl.Log.Stream("s"), "g")) == "1" })

			from, to := leader.Node.ID(), fl.Node.ID()
			if dir.toLeader {
				from, to = to, from
			}
			start := time.Now()
			fnet.Stall(from, to, stall)
			if err := s.WriteState(map[string][]byte{"g": []byte("2")}, nil); err != nil {
				t.Fatalf("state write %v into the stall: %v", time.Since(start).Round(time.Millisecond), err)
			}
			if took := time.Since(start); took > stall/2 {
				t.Fatalf("state write answered %v into the stall of the follower's connection: it waited for the silent one",
					took.Round(time.Millisecond))
			} else {
				t.Logf("state write answered %v into the stall", took.Round(time.Millisecond))
			}
			if got := string(loadKey(t, fl.Log.Stream("s"), "g")); got != "2" {
				t.Fatalf("%s holds g=%q after the write was answered, want 2", fl.Node.ID(), got)
			}
		})
	}
}
