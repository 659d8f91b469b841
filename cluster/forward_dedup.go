package cluster

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/peatmq/peat/cluster/wire"
)

// Forwarded appends are idempotent, as Kafka's idempotent producer makes
// a producer's (KIP-98), so that a follower can send them again.
//
// A forward connection that lived through a cut may stay silent for
// seconds after the heal: TCP sends a lost segment again only at its
// next retransmission, 0.2, 0.6, 1.4, 3.0 s... after the first send. A
// forwarder whose oldest append has gone unanswered for fwdResendAfter
// therefore dials the leader again and, once a new connection connects,
// gives the old one up and sends the appends unanswered on it again on
// the new one (forward_resend.go). The leader may hold them already (the
// answers, not the requests, may be what the old connection held up), so
// it keeps, per stream and sending node, what it answered each recent
// forward (fwdProducers): a forward seen before is answered as its first
// copy was, or will be once that one commits, and never appended twice.
//
// A forward's Seq names it: a producer id in the high 32 bits, drawn at
// random when the node first forwards to the stream, never 0, and the
// count of the node's forwards of the stream in the low 32 (a new id once
// they run out). So a Seq is never reused by a running node; a restarted
// one draws its ids again. A Seq whose producer id is 0 comes from a node that
// predates this and never sends again: it is not remembered. A node
// advertises that it remembers (Serf tag tagDedup), and a forwarder sends
// again only to a leader that does.
//
// What is remembered, per producer, is every forward received from the
// lowest one kept up (low), in Seq order. A forward received twice is
// found there. One not found at or above low was never received, and is
// appended. One below low was forgotten: the leader cannot tell whether
// it holds it, and refuses it as of unknown fate (the forwarder's
// producer publishes again, at least once). The forwarder has at most
// fwdWindow appends unanswered and sends again only those, so keeping
// the last fwdSeenMax forwards, answered or not, finds every forward sent
// again. A producer that sent nothing for fwdSeenFor, or twice this
// node's forward timeout if longer (longer than any forwarder of the
// site waits for an answer), is forgotten whole: a forward of it that
// still comes is one its forwarder has already refused, and appending
// it is then at least once, as publishing it again would be.
//
// A leader epoch is one process's: a leader that restarts registers a new
// broker epoch, and the controller elects anew (rules.State's
// registerBroker), so what a leader remembers is never needed by a
// process that does not have it.
const (
	fwdSeenMax = 2 * fwdWindow
	fwdSeenFor = time.Minute
)

// tagDedup is the Serf tag of a node whose leaders remember forwards
// (fwdProducers): a forwarder sends again only to such a leader.
const tagDedup = "fd"

// fateForgotten refuses a forward sent again after the leader forgot it.
const fateForgotten = "the stream's leader no longer knows whether it stored the message; it may or may not be stored: publish again"

// fwdProducers is what a stream's leader remembers of the forwards it
// received.
type fwdProducers struct {
	keep  time.Duration // how long a silent producer and an answered forward are kept
	mu    sync.Mutex
	by    map[fwdProducerKey]*fwdProducer
	swept time.Time
}

type fwdProducerKey struct {
	from string // the forwarding node
	id   uint32 // its producer id, Seq's high 32 bits
}

type fwdProducer struct {
	// order is held from a forward's look-up to its append's call: two
	// connections that carry the same forwards (one old, one new) append
	// each once, in Seq order.
	order sync.Mutex
	mu    sync.Mutex // guards the rest
	seen  []*fwdSeen // by Seq, ascending
	low   uint64     // forwards below were forgotten
	last  time.Time  // when the last forward came
}

type fwdSeen struct {
	seq     uint64
	at      time.Time             // when answered
	resp    *wire.ProduceResponse // nil until answered
	waiting []func(*wire.ProduceResponse)
}

// handle answers the forward seq from node from: a forward seen before
// gets its first copy's answer (answer runs when that one is answered);
// any other runs send, whose finish remembers the answer and passes it
// to answer. send is called in Seq order for each producer.
func (t *fwdProducers) handle(from string, seq uint64, answer func(*wire.ProduceResponse), send func(finish func(*wire.ProduceResponse))) {
	id := uint32(seq >> 32)
	if id == 0 {
		send(answer) // a node that predates producer ids: nothing to look up
		return
	}
	now := time.Now()
	p := t.producer(fwdProducerKey{from, id}, now)
	p.order.Lock()
	defer p.order.Unlock()
	p.mu.Lock()
	i, found := slices.BinarySearchFunc(p.seen, seq, func(e *fwdSeen, seq uint64) int { return cmp.Compare(e.seq, seq) })
	switch {
	case found && p.seen[i].resp != nil:
		resp := p.seen[i].resp
		p.mu.Unlock()
		answer(resp)
		return
	case found:
		p.seen[i].waiting = append(p.seen[i].waiting, answer)
		p.mu.Unlock()
		return
	case seq < p.low:
		p.mu.Unlock()
		answer(&wire.ProduceResponse{Code: wire.Timeout, Seq: seq, Message: fateForgotten})
		return
	}
	e := &fwdSeen{seq: seq}
	p.seen = slices.Insert(p.seen, i, e)
	p.forget(now, t.keep)
	p.mu.Unlock()
	send(func(resp *wire.ProduceResponse) {
		p.mu.Lock()
		e.resp, e.at = resp, time.Now()
		waiting := e.waiting
		e.waiting = nil
		p.mu.Unlock()
		answer(resp)
		for _, w := range waiting {
			w(resp)
		}
	})
}

// forget drops the oldest answered forwards beyond fwdSeenMax or
// answered longer than keep ago; p.mu is held. One still unanswered
// stops it: those behind are bounded by the produce pipelines' queues.
func (p *fwdProducer) forget(now time.Time, keep time.Duration) {
	n := 0
	for _, e := range p.seen {
		if e.resp == nil || (len(p.seen)-n <= fwdSeenMax && now.Sub(e.at) < keep) {
			break
		}
		p.low = e.seq + 1
		n++
	}
	if n > 0 {
		clear(p.seen[:n])
		p.seen = p.seen[n:]
	}
}

// producer is key's, made if new; producers silent for keep are
// forgotten whole, looked for at most once per keep.
func (t *fwdProducers) producer(key fwdProducerKey, now time.Time) *fwdProducer {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Sub(t.swept) >= t.keep {
		t.swept = now
		for k, p := range t.by {
			p.mu.Lock()
			idle := now.Sub(p.last) >= t.keep
			p.mu.Unlock()
			if idle {
				delete(t.by, k)
			}
		}
	}
	if t.by == nil {
		t.by = map[fwdProducerKey]*fwdProducer{}
	}
	p := t.by[key]
	if p == nil {
		p = &fwdProducer{}
		t.by[key] = p
	}
	p.mu.Lock()
	p.last = now // under t.mu: a sweep cannot drop p between here and its use
	p.mu.Unlock()
	return p
}

// fwdSeq numbers one node's forwards of one stream (the Seq above).
type fwdSeq struct {
	mu    sync.Mutex
	id    uint32
	count uint32
}

// next is the Seq of a forward sent for the first time.
func (q *fwdSeq) next() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.id == 0 || q.count == math.MaxUint32 {
		q.id, q.count = newProducerID(q.id), 0
	}
	q.count++
	return uint64(q.id)<<32 | uint64(q.count)
}

// newProducerID draws a producer id other than 0 and old.
func newProducerID(old uint32) uint32 {
	for {
		if id := rand.Uint32(); id != 0 && id != old {
			return id
		}
	}
}
