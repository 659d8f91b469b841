package sitetest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// Leader kill -9 under QoS 1 load from producers homed on all three
// nodes, -sitetest.rounds times (20), the killed node restarted each
// round and back in the ISR before the next: every acknowledged message is
// on every replica at the same offset, the replicas are identical, and
// publishing resumes after every kill under a new leader in a higher
// epoch.
func TestSite_LeaderKill(t *testing.T) {
	needSite(t)
	st := streamSpec{"load", "load/#"}
	s := newSite(t, 3, st)
	l := startLoad(t, s, "lk", st.topic(), 2)
	l.waitResumed(time.Now().Add(-time.Hour), 50)
	var gaps []time.Duration
	for round := 1; round <= *roundsFlag; round++ {
		ld := s.leader(st.name)
		epoch := ld.epoch(st.name)
		killAt := time.Now()
		ld.kill()
		gap := l.waitResumed(killAt, 20)
		next := s.leader(st.name)
		if next == ld || next.epoch(st.name) <= epoch {
			t.Fatalf("round %d: after %s (epoch %d) died, leader %s in epoch %d", round, ld.id, epoch, next.id, next.epoch(st.name))
		}
		gaps = append(gaps, gap)
		t.Logf("round %d: kill -9 %s (leader, epoch %d): acknowledgements resumed %v later, %s leads in epoch %d",
			round, ld.id, epoch, gap.Round(time.Millisecond), next.id, next.epoch(st.name))
		restartAt := time.Now()
		ld.start()
		ld.waitServing()
		s.waitFullISR(st.name, restartAt)
		l.waitResumed(time.Now(), 20)
	}
	l.stop()
	t.Logf("producers: %s", l.summary())
	s.check(st, l)
	report(t, "leader-kill", gaps)
}

// Follower kill -9 under load, then restart: the leader keeps leading in
// its epoch, publishing goes on without it, it rejoins the ISR, and no
// replica diverges (a follower's log past the leader's epoch end would
// show as a different record at some offset).
func TestSite_FollowerKill(t *testing.T) {
	needSite(t)
	st := streamSpec{"load", "load/#"}
	s := newSite(t, 3, st)
	l := startLoad(t, s, "fk", st.topic(), 2)
	l.waitResumed(time.Now().Add(-time.Hour), 50)
	for round := 1; round <= 3; round++ {
		ld := s.leader(st.name)
		epoch := ld.epoch(st.name)
		var f *node
		for _, nd := range s.nodes {
			if nd != ld {
				f = nd
				if round%2 == 0 {
					break
				}
			}
		}
		killAt := time.Now()
		f.kill()
		l.waitResumed(killAt, 50)
		restartAt := time.Now()
		f.start()
		f.waitServing()
		s.waitFullISR(st.name, restartAt)
		l.waitResumed(time.Now(), 50)
		if now := s.leader(st.name); now != ld || now.epoch(st.name) != epoch {
			t.Fatalf("round %d: a follower's death moved the leadership from %s (epoch %d) to %s (epoch %d)",
				round, ld.id, epoch, now.id, now.epoch(st.name))
		}
		t.Logf("round %d: kill -9 %s (follower of %s); publishing went on, it rejoined the ISR", round, f.id, ld.id)
	}
	l.stop()
	t.Logf("producers: %s", l.summary())
	s.check(st, l)
}

// Controller (Raft leader) kill -9, with three streams whose leaders the
// site spreads over the three nodes: another node becomes controller, the
// streams led elsewhere keep their leader and epoch (no failover) and
// keep acknowledging, and nothing acknowledged is lost on any stream.
func TestSite_ControllerKill(t *testing.T) {
	needSite(t)
	// Names whose hash starts their replica lists on three different
	// nodes (cluster.pickReplicas), so leaders spread.
	streams := []streamSpec{{"cg", "cg/#"}, {"a", "a/#"}, {"c", "c/#"}}
	s := newSite(t, 3, streams...)
	for round := 1; round <= 2; round++ {
		ctrl := s.controller()
		leaders := map[string]*node{}
		epochs := map[string]uint64{}
		loads := map[string]*load{}
		for _, st := range streams {
			leaders[st.name] = s.leader(st.name)
			epochs[st.name] = leaders[st.name].epoch(st.name)
			loads[st.name] = startLoad(t, s, fmt.Sprintf("ck%d-%s", round, st.name), st.topic(), 1)
		}
		elsewhere := 0
		for _, st := range streams {
			loads[st.name].waitResumed(time.Now().Add(-time.Hour), 20)
			if leaders[st.name] != ctrl {
				elsewhere++
			}
		}
		if elsewhere == 0 {
			t.Fatalf("every stream is led by the controller %s: nothing to show", ctrl.id)
		}
		killAt := time.Now()
		ctrl.kill()
		next := s.controller()
		if next == ctrl {
			t.Fatalf("round %d: %s is still the controller after its kill", round, ctrl.id)
		}
		t.Logf("round %d: kill -9 %s (controller): %s is controller %v later", round, ctrl.id, next.id,
			time.Since(killAt).Round(time.Millisecond))
		for _, st := range streams {
			gap := loads[st.name].waitResumed(killAt, 20)
			ld := leaders[st.name]
			if ld == ctrl {
				t.Logf("round %d: %s was led by the controller: acknowledgements resumed %v after the kill, under %s",
					round, st.name, gap.Round(time.Millisecond), s.leader(st.name).id)
				continue
			}
			if now := s.leader(st.name); now != ld || now.epoch(st.name) != epochs[st.name] {
				t.Fatalf("round %d: stream %s was led by %s (epoch %d), not the controller %s, and moved to %s (epoch %d)",
					round, st.name, ld.id, epochs[st.name], ctrl.id, now.id, now.epoch(st.name))
			}
			t.Logf("round %d: %s kept its leader %s: acknowledgements resumed %v after the controller's kill (messages sent after it)",
				round, st.name, ld.id, gap.Round(time.Millisecond))
		}
		restartAt := time.Now()
		ctrl.start()
		ctrl.waitServing()
		for _, st := range streams {
			s.waitFullISR(st.name, restartAt)
		}
		for _, st := range streams {
			loads[st.name].stop()
			s.check(st, loads[st.name])
		}
	}
}

// Rolling restart under load: each node in turn stopped with SIGTERM (it
// hands its streams over), started again and back in the ISR before the
// next: nothing acknowledged is lost.
func TestSite_RollingRestart(t *testing.T) {
	needSite(t)
	st := streamSpec{"load", "load/#"}
	s := newSite(t, 3, st)
	l := startLoad(t, s, "rr", st.topic(), 2)
	l.waitResumed(time.Now().Add(-time.Hour), 50)
	for _, nd := range s.nodes {
		stopAt := time.Now()
		nd.stop()
		gap := l.waitResumed(stopAt, 20)
		nd.start()
		nd.waitServing()
		s.waitFullISR(st.name, stopAt)
		t.Logf("restarted %s: acknowledgements went on %v after its SIGTERM", nd.id, gap.Round(time.Millisecond))
	}
	l.waitResumed(time.Now(), 50)
	l.stop()
	t.Logf("producers: %s", l.summary())
	s.check(st, l)
}

// A consumer group member reading (QoS 1, acknowledging each record) from
// the node that leads the stream, which is then killed: the consumer
// moves to another node, as a client with the site's addresses does, and
// gets every offset: none is missing (some may come twice: at least once).
func TestSite_ConsumerGroupFailover(t *testing.T) {
	needSite(t)
	st := streamSpec{"load", "load/#"}
	s := newSite(t, 3, st)
	ld := s.leader(st.name)
	l := startLoad(t, s, "cgp", st.topic(), 1)
	cons := startConsumer(t, s, ld, "g1", st)
	testwait.EventuallyWithin(t, wait(60*time.Second), "the consumer's first 200 records", func() bool { return cons.count() >= 200 })
	killAt := time.Now()
	ld.kill()
	testwait.EventuallyWithin(t, wait(90*time.Second), "records delivered to the consumer by another node", func() bool {
		return cons.deliveredAfter(killAt, ld.mqtt) >= 50
	})
	restartAt := time.Now()
	ld.start()
	ld.waitServing()
	s.waitFullISR(st.name, restartAt)
	l.stop()
	end := s.settle(st.name)
	testwait.EventuallyWithin(t, wait(90*time.Second), fmt.Sprintf("the consumer to have every offset below %d", end), func() bool {
		return cons.missing(end) == 0
	})
	cons.stop()
	t.Logf("consumer: %d deliveries of %d records; %d offsets delivered more than once (at least once); nodes used: %v",
		cons.count(), end, cons.dups(), cons.nodes())
	s.check(st, l)
}

// consumer is one group member that moves to the next node when its node
// fails or goes quiet.
type consumer struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     struct {
		sync.Mutex
		seen  map[uint64]int
		total int
		after []delivery
	}
}

type delivery struct {
	at   time.Time
	node string
}

func startConsumer(t *testing.T, s *site, home *node, group string, st streamSpec) *consumer {
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{cancel: cancel, done: make(chan struct{})}
	c.mu.seen = map[uint64]int{}
	addrs := s.addrs()
	cur := slices.Index(addrs, home.mqtt)
	go func() { // owned by c: ends on stop
		defer close(c.done)
		for ctx.Err() == nil {
			c.session(ctx, addrs[cur], group, st)
			cur = (cur + 1) % len(addrs)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(c.stop)
	return c
}

// quiet is how long a consumer waits for a record before it tries the
// next node.
const quiet = 5 * time.Second

// session reads from one node until it fails or goes quiet.
func (c *consumer) session(ctx context.Context, addr, group string, st streamSpec) {
	conn, err := dial(addr, "consumer-"+group, 5)
	if err != nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	defer conn.close()
	if err := conn.subscribe("$group/"+group+"/+/"+st.filter, 1); err != nil {
		return
	}
	for {
		pk, err := conn.readTimeout(wait(quiet))
		if err != nil {
			return
		}
		parts := strings.SplitN(pk.TopicName, "/", 4) // $group/<name>/<offset>/<topic>
		if len(parts) != 4 {
			return
		}
		off, err := strconv.ParseUint(parts[2], 10, 64)
		if err != nil {
			return
		}
		c.mu.Lock()
		c.mu.seen[off]++
		c.mu.total++
		c.mu.after = append(c.mu.after, delivery{at: time.Now(), node: addr})
		c.mu.Unlock()
		if pk.FixedHeader.Qos > 0 {
			if err := conn.puback(pk.PacketID); err != nil {
				return
			}
		}
	}
}

func (c *consumer) stop() {
	c.cancel()
	<-c.done
}

func (c *consumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.total
}

func (c *consumer) deliveredAfter(since time.Time, notAddr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return countAfter(c.mu.after, since, notAddr)
}

// countAfter counts the deliveries after since through nodes other than
// notAddr.
func countAfter(ds []delivery, since time.Time, notAddr string) int {
	n := 0
	for _, d := range ds {
		if d.at.After(since) && d.node != notAddr {
			n++
		}
	}
	return n
}

func (c *consumer) missing(end uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for off := range end {
		if c.mu.seen[off] == 0 {
			n++
		}
	}
	return n
}

func (c *consumer) dups() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.mu.seen {
		if k > 1 {
			n++
		}
	}
	return n
}

func (c *consumer) nodes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, d := range c.mu.after {
		if !slices.Contains(out, d.node) {
			out = append(out, d.node)
		}
	}
	return out
}
