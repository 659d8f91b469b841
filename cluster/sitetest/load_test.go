package sitetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// msgState is what a producer knows of one message.
type msgState struct {
	attempts int  // times sent
	acked    bool // a PUBACK with success came
	first    bool // acknowledged on its first attempt
}

// ledger is every producer's messages, and what they met.
type ledger struct {
	// rehome is raised to send every producer back to its home node
	// (load.rehome).
	rehome atomic.Int64
	mu     struct {
		sync.Mutex
		msgs      map[string]*msgState
		acks      int
		refusals  int // PUBACK >= 0x80
		lost      int // connection lost, closed (3.1.1 refusal) or no PUBACK in time
		dialFails int
		moves     int // connections to a node other than the producer's home
		// acksAfter holds every acknowledgement in the order they came:
		// when its message was (last) sent, and when the PUBACK came.
		acksAfter []ackAt
		// answers are, per producer, when a node answered one of its
		// publishes: an acknowledgement or a refusal (a PUBACK >= 0x80,
		// a DISCONNECT, a connection closed or reset), not a PUBACK that
		// never came. The partition tests measure stalls from them.
		answers map[string][]answer
		// at is the node (index in the site's addresses) each producer's
		// connection is to, or was to last.
		at map[string]int
	}
}

type answer struct {
	at  time.Time
	ack bool
}

type ackAt struct{ sent, acked time.Time }

func newLedger() *ledger {
	l := &ledger{}
	l.mu.msgs = map[string]*msgState{}
	l.mu.answers = map[string][]answer{}
	l.mu.at = map[string]int{}
	return l
}

// load runs producers until stopped.
type load struct {
	t      testing.TB
	ledger *ledger
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startLoad starts perNode producers on each node (homes spread over the
// site, every other one MQTT 3.1.1), publishing to topic.
func startLoad(t testing.TB, s *site, name, topic string, perNode int) *load {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{t: t, ledger: newLedger(), cancel: cancel}
	addrs := s.addrs()
	for i := range perNode * len(addrs) {
		version := byte(5)
		if i%2 == 1 {
			version = 4
		}
		p := producer{id: fmt.Sprintf("%s-p%d", name, i), addrs: addrs, home: i % len(addrs), version: version, topic: topic}
		l.wg.Add(1)
		go func() { // owned by l: ends on stop
			defer l.wg.Done()
			p.run(ctx, l.ledger)
		}()
	}
	t.Cleanup(l.stop)
	return l
}

// stop ends the producers and waits for them; idempotent.
func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

// waitResumed waits until a message sent after since is acknowledged
// (at least n of them), and returns how long after since the first came.
func (l *load) waitResumed(since time.Time, n int) time.Duration {
	l.t.Helper()
	var first time.Duration
	testwait.EventuallyWithin(l.t, wait(90*time.Second), fmt.Sprintf("%d acknowledgements of messages sent after %s", n, since.Format("15:04:05.000")), func() bool {
		l.ledger.mu.Lock()
		defer l.ledger.mu.Unlock()
		count := 0
		acks := l.ledger.mu.acksAfter
		for i := len(acks) - 1; i >= 0 && acks[i].acked.After(since); i-- {
			if acks[i].sent.After(since) {
				first = acks[i].acked.Sub(since) // the earliest, once the loop ends
				count++
			}
		}
		return count >= n
	})
	return first
}

// rehome sends every producer back to its home node before its next
// message: the partition tests start each round with producers on every
// node, wherever the last round's failovers took them.
func (l *load) rehome() { l.ledger.rehome.Add(1) }

// summary says what the producers met.
func (l *load) summary() string {
	l.ledger.mu.Lock()
	defer l.ledger.mu.Unlock()
	retried := 0
	for _, m := range l.ledger.mu.msgs {
		if m.attempts > 1 {
			retried++
		}
	}
	return fmt.Sprintf("%d acknowledged, %d messages retried, %d refusals (PUBACK >= 0x80), %d connections lost or refused (3.1.1), "+
		"%d failed dials, %d connections away from the producer's home node",
		l.ledger.mu.acks, retried, l.ledger.mu.refusals, l.ledger.mu.lost, l.ledger.mu.dialFails, l.ledger.mu.moves)
}

// producer publishes QoS 1 messages one at a time, as a sensor does.
type producer struct {
	id      string
	addrs   []string
	home    int
	version byte
	topic   string
}

// ackWait is how long a producer waits for a PUBACK before it takes the
// connection for lost (acks=all waits for the ISR; a failover is seconds).
const ackWait = 15 * time.Second

func (p *producer) run(ctx context.Context, l *ledger) {
	cur := p.home
	var c *conn
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	seq := 0
	payload := ""
	rehomed := l.rehome.Load()
	backoff := func() {
		if c != nil {
			c.Close()
			c = nil
		}
		cur = (cur + 1) % len(p.addrs) // the next server of the list
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	for ctx.Err() == nil {
		if g := l.rehome.Load(); g != rehomed {
			rehomed = g
			if c != nil && cur != p.home {
				c.close()
				c = nil
			}
			cur = p.home
		}
		if c == nil {
			var err error
			c, err = dialWithin(p.addrs[cur], p.id, p.version, wait(*connectFlag))
			if err != nil {
				l.mu.Lock()
				l.mu.dialFails++
				l.mu.Unlock()
				c = nil
				backoff()
				continue
			}
			l.mu.Lock()
			if cur != p.home {
				l.mu.moves++
			}
			l.mu.at[p.id] = cur
			l.mu.Unlock()
		}
		if payload == "" {
			seq++
			payload = fmt.Sprintf("%s-%d", p.id, seq)
		}
		l.mu.Lock()
		m := l.mu.msgs[payload]
		if m == nil {
			m = &msgState{}
			l.mu.msgs[payload] = m
		}
		m.attempts++
		l.mu.Unlock()
		sent := time.Now()
		err := c.publish(p.topic, []byte(payload), wait(ackWait))
		now := time.Now()
		l.mu.Lock()
		switch {
		case err == nil:
			m.acked, m.first = true, m.attempts == 1
			l.mu.acks++
			l.mu.acksAfter = append(l.mu.acksAfter, ackAt{sent: sent, acked: now})
			payload = ""
		case errors.Is(err, errRefused):
			l.mu.refusals++
		default:
			l.mu.lost++
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			l.mu.answers[p.id] = append(l.mu.answers[p.id], answer{at: now, ack: err == nil})
		}
		l.mu.Unlock()
		if err != nil {
			backoff()
		}
	}
}
