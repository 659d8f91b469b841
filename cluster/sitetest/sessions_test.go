package sitetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/mqtt/mqtttest/rawmqtt"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// A QoS 1 subscriber with a persistent session (MQTT 3.1.1, clean
// session false) on the node that leads the site's sessions' stream,
// under load from producers on every node; that node is killed with
// kill -9. The subscriber connects to the next node with clean session
// false and without subscribing: its session is present there, and it
// gets every message the producers had acknowledged, none lost (some
// more than once: what it had not acknowledged, and what the dead node
// had not written of its position yet).
func TestSite_DurableSessionKill(t *testing.T) {
	needSite(t)
	st := streamSpec{"load", "load/#"}
	s := newSite(t, 3, st)
	home := s.leader(cluster.SessionsStream)
	sub := startDurable(t, s, home, "durable-1", st.filter)
	testwait.EventuallyWithin(t, wait(60*time.Second), "the subscription", sub.subscribed)
	l := startLoad(t, s, "dsp", st.topic(), 1) // every message acknowledged from now on is the subscriber's
	testwait.EventuallyWithin(t, wait(60*time.Second), "the subscriber's first 200 messages", func() bool { return sub.count() >= 200 })

	killAt := time.Now()
	home.kill()
	testwait.EventuallyWithin(t, wait(90*time.Second), "messages delivered to the subscriber by another node", func() bool {
		return sub.deliveredAfter(killAt, home.mqtt) >= 50
	})
	l.stop()
	var acked []string
	l.ledger.mu.Lock()
	for p, m := range l.ledger.mu.msgs {
		if m.acked {
			acked = append(acked, p)
		}
	}
	l.ledger.mu.Unlock()
	testwait.EventuallyWithin(t, wait(90*time.Second), fmt.Sprintf("the subscriber to have all %d acknowledged messages", len(acked)), func() bool {
		return len(sub.missing(acked)) == 0
	})
	sub.stop()
	if !sub.resumedPresent() {
		t.Fatalf("a session on another node was not present: %v", sub.presence())
	}
	t.Logf("subscriber: %d deliveries of %d acknowledged messages; sessions: %v; %s", sub.count(), len(acked), sub.presence(), l.summary())
}

// durable is one subscriber with a persistent session that moves to the
// next node when its node fails, without subscribing again.
type durable struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     struct {
		sync.Mutex
		seen    map[string]int
		total   int
		after   []delivery
		present []string // "node present=bool" per connection
		subbed  bool
	}
}

func startDurable(t *testing.T, s *site, home *node, id, filter string) *durable {
	ctx, cancel := context.WithCancel(context.Background())
	d := &durable{cancel: cancel, done: make(chan struct{})}
	d.mu.seen = map[string]int{}
	addrs := s.addrs()
	cur := slices.Index(addrs, home.mqtt)
	subscribed := false
	go func() { // owned by d: ends on stop
		defer close(d.done)
		for ctx.Err() == nil {
			if d.session(ctx, addrs[cur], id, filter, &subscribed) {
				cur = (cur + 1) % len(addrs)
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(d.stop)
	return d
}

// session reads from one node until the connection fails; it reports
// whether to move on to the next node (the connection was made, and lost).
func (d *durable) session(ctx context.Context, addr, id, filter string, subscribed *bool) (next bool) {
	c, present, err := dialDurable(addr, id)
	if err != nil {
		return true
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.close()
	d.mu.Lock()
	d.mu.present = append(d.mu.present, fmt.Sprintf("%s present=%v", addr, present))
	d.mu.Unlock()
	if !*subscribed {
		if err := c.subscribe(filter, 1); err != nil {
			return false
		}
		*subscribed = true
		d.mu.Lock()
		d.mu.subbed = true
		d.mu.Unlock()
	}
	for {
		pk, err := c.readTimeout(wait(time.Minute))
		if err != nil {
			return true
		}
		d.mu.Lock()
		d.mu.seen[string(pk.Payload)]++
		d.mu.total++
		d.mu.after = append(d.mu.after, delivery{at: time.Now(), node: addr})
		d.mu.Unlock()
		if pk.FixedHeader.Qos > 0 {
			if err := c.puback(pk.PacketID); err != nil {
				return true
			}
		}
	}
}

// dialDurable connects with MQTT 3.1.1 and clean session false, and
// returns the CONNACK's session present.
func dialDurable(addr, id string) (*conn, bool, error) {
	c, err := dialConnect(addr, rawmqtt.Connect{ClientID: id, Version: 4, Keepalive: 60},
		30*time.Second) // a claim waits for a failing-over leader
	if err != nil {
		return nil, false, err
	}
	return c, c.Connack().SessionPresent, nil
}

func (d *durable) subscribed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.subbed
}

func (d *durable) stop() {
	d.cancel()
	<-d.done
}

func (d *durable) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.total
}

func (d *durable) deliveredAfter(since time.Time, notAddr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return countAfter(d.mu.after, since, notAddr)
}

func (d *durable) missing(payloads []string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, p := range payloads {
		if d.mu.seen[p] == 0 {
			out = append(out, p)
		}
	}
	return out
}

func (d *durable) presence() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.mu.present)
}

// resumedPresent reports whether every connection after the first found
// its session present (and there was one).
func (d *durable) resumedPresent() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.mu.present) < 2 {
		return false
	}
	for _, p := range d.mu.present[1:] {
		if !strings.HasSuffix(p, "present=true") {
			return false
		}
	}
	return true
}
