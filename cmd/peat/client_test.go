package main

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/edge"
	"github.com/peatmq/peat/logstore"
)

// publisher is one MQTT 3.1.1 client publishing QoS 1 messages with up to
// window of them in flight. Message seq carries the payload "<id>/<seq>".
type publisher struct {
	t      testing.TB
	client paho.Client
	id     string
	topic  string
	acks   *atomic.Int64 // shared ack counter, may be nil
	pad    string        // appended to every payload

	pending chan pendingPub // the in-flight window, in publish order
	done    chan struct{}   // closed when the collector has seen every token
	stopped atomic.Bool     // a publish failed: the connection is gone

	mu    sync.Mutex
	acked []int
}

type pendingPub struct {
	seq   int
	token paho.Token
}

func payloadOf(id string, seq int) string { return fmt.Sprintf("%s/%d", id, seq) }

func newPublisher(t testing.TB, addr, id, topic string, window int) *publisher {
	t.Helper()
	opts := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(10 * time.Second).
		// Bounds a Publish stuck on a connection the kill took away.
		SetWriteTimeout(2 * time.Second).
		SetOrderMatters(false)
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s to %s: %v", id, addr, tok.Error())
	}
	p := &publisher{
		t: t, client: c, id: id, topic: topic,
		pending: make(chan pendingPub, window-1), // plus the one the collector waits on
		done:    make(chan struct{}),
	}
	go p.collect()
	t.Cleanup(func() { c.Disconnect(0) })
	return p
}

// collect waits for each publish's PUBACK, in order; it ends when pending
// is closed. A token that fails or times out means the connection is gone.
func (p *publisher) collect() {
	defer close(p.done)
	for pp := range p.pending {
		if !pp.token.WaitTimeout(30*time.Second) || pp.token.Error() != nil {
			p.stopped.Store(true)
			continue
		}
		p.mu.Lock()
		p.acked = append(p.acked, pp.seq)
		p.mu.Unlock()
		if p.acks != nil {
			p.acks.Add(1)
		}
	}
}

// publish sends n messages (fewer if the connection goes), then stops.
func (p *publisher) publish(n int) {
	p.run(n, nil)
}

// run publishes until n messages are sent (n < 0: no limit), stop is
// closed, or the connection is gone; then it waits for the outstanding
// acknowledgements.
func (p *publisher) run(n int, stop <-chan struct{}) {
	defer close(p.pending)
	for seq := 0; n < 0 || seq < n; seq++ {
		if p.stopped.Load() {
			return
		}
		select {
		case <-stop:
			return
		default:
		}
		tok := p.client.Publish(p.topic, 1, false, payloadOf(p.id, seq)+p.pad)
		p.pending <- pendingPub{seq, tok}
	}
}

// wait returns the acknowledged sequence numbers once every publish is
// acknowledged or failed.
func (p *publisher) wait() []int {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.acked...)
}

// subscriber collects the payloads it receives on filter.
type subscriber struct {
	client paho.Client
	msgs   chan paho.Message
}

func newSubscriber(t testing.TB, addr, id, filter string) *subscriber {
	t.Helper()
	s := &subscriber{msgs: make(chan paho.Message, 10000)}
	opts := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(true)
	s.client = paho.NewClient(opts)
	if tok := s.client.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	tok := s.client.Subscribe(filter, 1, func(_ paho.Client, m paho.Message) { s.msgs <- m })
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s to %s: %v", id, filter, tok.Error())
	}
	t.Cleanup(func() { s.client.Disconnect(0) })
	return s
}

// next returns the next message, failing the test after a minute without one.
func (s *subscriber) next(t testing.TB) paho.Message {
	t.Helper()
	select {
	case m := <-s.msgs:
		return m
	case <-time.After(time.Minute):
		t.Fatal("no message for a minute")
		return nil
	}
}

// readLog opens the data directory of a stopped node the way peat serve
// does (with the profile the tests run it with) and returns every record
// of the stream.
func readLog(t testing.TB, dataDir, stream string) []*logstore.Record {
	t.Helper()
	cfg := edge.DefaultConfig()
	cfg.DataDir = dataDir
	cfg.Storage.Profile = string(logstore.ProfilePiZero)
	store, err := logstore.Open(cfg.StoreConfig())
	if err != nil {
		t.Fatalf("open the log in %s: %v", dataDir, err)
	}
	defer func() {
		if err := store.Close(); err != nil {
			t.Errorf("close the log: %v", err)
		}
	}()
	s := store.Stream(stream)
	if s == nil {
		t.Fatalf("no stream %q in %s", stream, dataDir)
	}
	var out []*logstore.Record
	for from := s.FirstOffset(); from < s.Committed(); {
		recs, err := s.Read(from, 1000, 1<<20)
		if err != nil {
			t.Fatalf("read %s from %d: %v", stream, from, err)
		}
		if len(recs) == 0 {
			t.Fatalf("read %s from %d below committed %d returned nothing", stream, from, s.Committed())
		}
		out = append(out, recs...)
		from = recs[len(recs)-1].Offset + 1
	}
	if s.NextOffset() != s.Committed() {
		t.Errorf("stream %s: next offset %d, committed %d, want equal on a single node", stream, s.NextOffset(), s.Committed())
	}
	return out
}
