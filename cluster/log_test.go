package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
	"github.com/peatmq/peat/mqtt/mqtttest/logtest"
)

// logMaxAge is the streams' retention in the contract test: longer than
// any record's age (the suite stamps records in 2023), so only the suite's
// Expire drops records.
const logMaxAge = 100 * 365 * 24 * time.Hour

// logStreams are the stream configurations of "name=filter[,filter]" specs.
func logStreams(tb testing.TB, specs []string) []logstore.StreamConfig {
	var out []logstore.StreamConfig
	for _, spec := range specs {
		name, filters, ok := strings.Cut(spec, "=")
		if !ok {
			tb.Fatalf("bad stream spec %q", spec)
		}
		out = append(out, logstore.StreamConfig{Name: name, Filters: strings.Split(filters, ","), MaxAge: logMaxAge})
	}
	return out
}

// forLog is o for a test of the Log's rules (startLogSite): its nodes
// configure no stream, their stores hold o.Stored ("s=s/#" when none),
// which the test creates on replicas of its choosing (createStreams);
// replica_lag_max is the default, followers fetch every 200 ms, and a
// node still up at cleanup stops as after a crash.
func (o siteOpts) forLog() siteOpts {
	o.Streams = []SiteStream{}
	if o.Stored == nil {
		o.Stored = []string{"s=s/#"}
	}
	o.LagMax = cmp.Or(o.LagMax, DefaultReplicaLagMax)
	o.FetchMaxWait = cmp.Or(o.FetchMaxWait, 200*time.Millisecond)
	o.Crash = true
	return o
}

// createStreams has the controller create each stream of specs on
// replicas, and waits until n's Log shows it and, when n is to lead it,
// n leads it.
func createStreams(tb testing.TB, n *testNode, replicas []string, names ...string) {
	tb.Helper()
	// The controller registers brokers as it reconciles with Serf; a
	// stream naming one it has not registered yet is refused. A reopened
	// node's state names it alive in its last epoch until its new one is
	// registered, which fences it and elects its streams' leaders anew.
	eventually(tb, "the controller to register "+strings.Join(replicas, ", "), func() bool {
		st, _ := n.Node.State()
		for _, id := range replicas {
			if b := st.Brokers[id]; b == nil || !b.Alive || id == n.Node.ID() && b.Epoch != n.Node.Epoch() {
				return false
			}
		}
		return true
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range names {
		if err := n.Node.Submit(ctx, rules.CreateStream{Name: name, Replicas: replicas}); err != nil {
			tb.Fatalf("create %s: %v", name, err)
		}
	}
	for _, name := range names {
		eventually(tb, n.Node.ID()+" serves "+name, func() bool {
			s, _ := n.Log.Stream(name).(*stream)
			if s == nil {
				return false
			}
			if replicas[0] != n.Node.ID() {
				return true
			}
			// Led in the state's leader epoch: an older leadership ends.
			_, epoch := s.stateLeaderID()
			ld := s.leading()
			return ld != nil && ld.epoch == epoch
		})
	}
}

// openSoloLog is logtest's Open on a one-node site.
func openSoloLog(minFree int64) logtest.Open {
	return func(t *testing.T, dir string, specs ...string) (mqtt.Log, func() error) {
		t.Helper()
		n := newTestSite(t, siteOpts{Voters: 1, Dirs: []string{dir}, Stored: specs, MinFree: minFree}.forLog()).nodes[0]
		var names []string
		for _, sc := range logStreams(t, specs) {
			names = append(names, sc.Name)
		}
		createStreams(t, n, []string{"n1"}, names...)
		logs[n.Log] = n
		return n.Log, func() error { return n.crash(t) }
	}
}

// logs finds a test Log's node (the suite's hooks get the Log only).
var logs = map[*Log]*testNode{}

// TestLog_Contract runs mqtt/log.go's contract against the Log of a
// one-node site: the node leads every stream, its ISR is itself.
func TestLog_Contract(t *testing.T) {
	logtest.TestLog(t, logtest.Suite{
		Open:     openSoloLog(-1),
		OpenFull: openSoloLog(math.MaxInt64),
		Reopen:   true,
		AddStream: func(t *testing.T, l mqtt.Log, spec string) {
			n := logs[l.(*Log)]
			sc := logStreams(t, []string{spec})[0]
			if _, err := n.store.AddStream(sc); err != nil {
				t.Fatalf("AddStream(%s): %v", spec, err)
			}
			createStreams(t, n, []string{"n1"}, sc.Name)
		},
		RemoveStream: func(t *testing.T, l mqtt.Log, name string) {
			n := logs[l.(*Log)]
			if err := n.store.RemoveStream(name); err != nil {
				t.Fatalf("RemoveStream(%s): %v", name, err)
			}
			eventually(t, name+" leaves the log", func() bool { return l.Stream(name) == nil })
		},
		Expire: func(t *testing.T, s mqtt.Stream, before time.Time) {
			if _, err := s.(*stream).st.ApplyRetention(context.Background(), before.Add(logMaxAge)); err != nil {
				t.Fatalf("ApplyRetention: %v", err)
			}
		},
	})
}

// startLogSite starts o.Voters voters (3 when 0) for a test of the
// Log's rules (o.forLog), and waits until they agree on a controller and
// it has registered them all. kill stops a node as a crash does.
func startLogSite(t *testing.T, o siteOpts) (nodes []*testNode, kill func(*testNode)) {
	t.Helper()
	nodes = newTestSite(t, o.forLog()).nodes
	kill = func(n *testNode) {
		if err := n.crash(t); err != nil {
			t.Errorf("close %s: %v", n.id, err)
		}
	}
	eventually(t, "one controller that has registered every node", func() bool {
		id := nodes[0].Node.Controller()
		for _, ln := range nodes {
			if ln.Node.Controller() != id || id == "" {
				return false
			}
			st, _ := ln.Node.State()
			for _, m := range nodes {
				if b := st.Brokers[m.Node.ID()]; b == nil || !b.Alive || b.Epoch != m.Node.Epoch() {
					return false
				}
			}
		}
		return true
	})
	return nodes, kill
}

// roles orders a site's nodes: the controller, then the others.
func roles(t *testing.T, nodes []*testNode) (ctl *testNode, others []*testNode) {
	t.Helper()
	for _, ln := range nodes {
		if ln.Node.IsController() {
			ctl = ln
		} else {
			others = append(others, ln)
		}
	}
	if ctl == nil {
		t.Fatal("no controller")
	}
	return ctl, others
}

// appendResult appends recs to s and waits for done.
func logAppend(t *testing.T, s mqtt.Stream, recs ...*logstore.Record) (uint64, error) {
	t.Helper()
	type res struct {
		first uint64
		err   error
	}
	ch := make(chan res, 1)
	s.AppendAsync(recs, func(first uint64, err error) { ch <- res{first, err} })
	select {
	case r := <-ch:
		return r.first, r.err
	case <-time.After(time.Minute):
		t.Fatalf("append to %s: done not called", s.Name())
		return 0, nil
	}
}

func logRecs(n int, prefix string) []*logstore.Record {
	out := make([]*logstore.Record, n)
	for i := range out {
		out[i] = &logstore.Record{Topic: fmt.Sprintf("s/%s/%d", prefix, i), QoS: 1, Payload: []byte(prefix)}
	}
	return out
}

// committedRecs waits until s has committed n records and returns them.
func committedRecs(t *testing.T, who string, s mqtt.Stream, n uint64) []*logstore.Record {
	t.Helper()
	eventually(t, who+" commits every record", func() bool { return s.Committed() >= n })
	got, err := s.Read(0, int(n), 0)
	if err != nil {
		t.Fatalf("%s: Read: %v", who, err)
	}
	return got
}

// TestLog_ThreeNodes: appends are taken on the stream's leader and
// answered once committed, reads on the followers return the same records
// at the same offsets, and after the leader dies the new leader's StateMoved fires and
// it takes appends from where the old one stopped.
func TestLog_ThreeNodes(t *testing.T) {
	nodes, kill := startLogSite(t, siteOpts{MinISR: 2})
	ctl, others := roles(t, nodes)
	leader, follower := others[0], others[1]
	// The leader is the first replica; the controller is next in line.
	replicas := []string{leader.Node.ID(), ctl.Node.ID(), follower.Node.ID()}
	// The store holds "s" everywhere; the Log shows it once the
	// controller's state does.
	for _, ln := range nodes {
		if ln.Log.Stream("s") != nil || ln.Log.Route("s/x") != nil || len(ln.Log.Streams()) != 0 {
			t.Fatalf("%s shows a stream the controller has not created", ln.Node.ID())
		}
	}
	events, cancel := follower.Log.WatchStreams()
	defer cancel()
	for _, ln := range nodes {
		createStreams(t, ln, replicas, "s")
	}
	if ev := logEvent(t, events); ev.Kind != logstore.StreamAdded || ev.Stream != follower.Log.Stream("s") {
		t.Fatalf("first event %v %v, want the created stream added", ev.Kind, ev.Stream)
	}
	ls := leader.Log.Route("s/x")
	var want []*logstore.Record
	for i := range 5 {
		batch := logRecs(4, strconv.Itoa(i))
		first, err := logAppend(t, ls, batch...)
		if err != nil || first != uint64(len(want)) {
			t.Fatalf("append %d at the leader: first %d err %v, want %d nil", i, first, err, len(want))
		}
		if c := ls.Committed(); c < first+4 {
			t.Fatalf("append %d answered with Committed %d, want at least %d", i, c, first+4)
		}
		want = append(want, batch...)
	}
	for _, ln := range []*testNode{ctl, follower} {
		s := ln.Log.Route("s/x")
		got := committedRecs(t, ln.Node.ID(), s, uint64(len(want)))
		if len(got) != len(want) {
			t.Fatalf("%s reads %d records, want %d", ln.Node.ID(), len(got), len(want))
		}
		for i, r := range got {
			if r.Offset != uint64(i) || r.Topic != want[i].Topic || string(r.Payload) != string(want[i].Payload) {
				t.Fatalf("%s offset %d: %d %s %q, want %d %s %q", ln.Node.ID(), i, r.Offset, r.Topic, r.Payload, i, want[i].Topic, want[i].Payload)
			}
		}
	}
	if err := ls.WriteState(map[string][]byte{"g/x": []byte("1")}, nil); err != nil {
		t.Fatalf("WriteState on the leader: %v", err)
	}
	if ok, _ := ls.Claim("g/x", "c1"); !ok {
		t.Fatal("Claim on the leader refused")
	}

	next := ctl.Log.Route("s/x")
	moved := next.StateMoved()
	kill(leader)
	select {
	case <-moved:
	case <-time.After(time.Minute):
		t.Fatal("StateMoved did not fire on the new leader")
	}
	var first uint64
	var err error
	eventually(t, "the new leader takes appends", func() bool {
		first, err = logAppend(t, next, logRecs(1, "after")...)
		return err == nil
	})
	if first != uint64(len(want)) {
		t.Fatalf("first append at the new leader at %d, want %d", first, len(want))
	}
	if ok, _ := next.Claim("g/x", "c2"); !ok {
		t.Fatal("the new leader refused a claim the dead leader held: claims live with the leader")
	}
	got := committedRecs(t, follower.Node.ID(), follower.Log.Route("s/x"), uint64(len(want))+1)
	if got[len(want)].Topic != "s/after/0" {
		t.Fatalf("the follower reads %s at %d, want the new leader's record", got[len(want)].Topic, len(want))
	}

	// Reassigned away from the follower, the stream stays in its Log: the
	// follower observes it (fetches without being a replica), so its
	// clients still read it there and their appends are forwarded.
	obs := follower.Log.Stream("s")
	ctx, cancelSubmit := context.WithTimeout(context.Background(), time.Minute)
	defer cancelSubmit()
	if err := ctl.Node.Submit(ctx, rules.AssignReplicas{Name: "s", Replicas: []string{ctl.Node.ID()}}); err != nil {
		t.Fatalf("AssignReplicas: %v", err)
	}
	eventually(t, "the follower to see the reassignment", func() bool {
		st, _ := follower.Node.State()
		return !slices.Contains(st.Streams["s"].Replicas, follower.Node.ID())
	})
	if follower.Log.Stream("s") != obs || follower.Log.Route("s/x") != obs {
		t.Fatal("the observer's Log lost a stream it observes")
	}
	// It reads what was committed, and its appends reach the leader,
	// whose answer comes back: one replica left, below the minimum of 2.
	if got := committedRecs(t, follower.Node.ID(), obs, uint64(len(want))+1); got[len(want)].Topic != "s/after/0" {
		t.Fatalf("the observer reads %s at %d", got[len(want)].Topic, len(want))
	}
	eventually(t, "the leader's refusal through the observer", func() bool {
		_, err = logAppend(t, obs, logRecs(1, "observed")...)
		return errors.Is(err, mqtt.ErrNotEnoughReplicas)
	})
	select {
	case ev := <-events:
		t.Fatalf("stream event %v %s on the observer, want none", ev.Kind, ev.Stream.Name())
	default:
	}
}

func logEvent(t *testing.T, events <-chan mqtt.StreamEvent) mqtt.StreamEvent {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-time.After(time.Minute):
		t.Fatal("no stream event")
		return mqtt.StreamEvent{}
	}
}

// TestLog_MinInsyncReplicas: with min_insync_replicas 3, the leader
// refuses appends with ErrNotEnoughReplicas once a follower's failure has
// taken it out of the ISR.
func TestLog_MinInsyncReplicas(t *testing.T) {
	nodes, kill := startLogSite(t, siteOpts{MinISR: 3})
	ctl, others := roles(t, nodes)
	replicas := []string{ctl.Node.ID(), others[0].Node.ID(), others[1].Node.ID()}
	for _, ln := range nodes {
		createStreams(t, ln, replicas, "s")
	}
	s := ctl.Log.Route("s/x")
	if _, err := logAppend(t, s, logRecs(3, "a")...); err != nil {
		t.Fatalf("append with the full ISR: %v", err)
	}
	kill(others[1])
	eventually(t, "the ISR loses the dead follower", func() bool {
		st, _ := ctl.Node.State()
		return len(st.Streams["s"].ISR) == 2
	})
	eventually(t, "the leader refuses below min_insync_replicas", func() bool {
		_, err := logAppend(t, s, logRecs(1, "b")...)
		if err != nil && !errors.Is(err, mqtt.ErrNotEnoughReplicas) {
			t.Fatalf("append below min_insync_replicas: %v, want ErrNotEnoughReplicas", err)
		}
		return err != nil
	})
	if c := s.Committed(); c != 3 {
		t.Fatalf("Committed %d below min_insync_replicas, want 3", c)
	}
}
