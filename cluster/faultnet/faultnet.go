// Package faultnet is an in-process network for cluster tests: nodes
// listen and dial by name, and a test drops, delays, cuts and partitions
// the links between them (tc netem is not available on the machines the
// tests run on, and a test in one process is faster and deterministic).
//
// A connection is a pair of byte queues, one each way, with TCP's
// failure modes rather than a datagram's: bytes are never lost in the
// middle of a stream. Per direction from -> to:
//
//   - Delay: each write is readable d after it was written (order kept).
//   - Cut: writes succeed but nothing is delivered (a blackhole, as after
//     `ip route add blackhole`); Heal delivers what was held, in order.
//   - Partition: Cut both ways, and dials between the two fail.
//   - Drop: the connections between two nodes are reset now (both ends
//     read an error); new dials work.
//   - Stall: the connections open now hold what they carry for a while,
//     as TCP connections that lived through a cut do after the heal
//     (their next retransmission is up to seconds away); new dials work.
package faultnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// ErrUnreachable is returned by a dial across a partition.
var ErrUnreachable = errors.New("faultnet: unreachable")

// ErrRefused is returned by a dial to a name nobody listens on.
var ErrRefused = errors.New("faultnet: connection refused")

// errReset is what both ends of a dropped connection read.
var errReset = errors.New("faultnet: connection reset")

type link struct{ from, to string }

// Network is the set of nodes and the faults between them.
type Network struct {
	mu        sync.Mutex
	listeners map[string]*listener
	cut       map[link]bool
	delay     map[link]time.Duration
	conns     map[*pipe]struct{} // every direction of every open connection
	seq       int
}

// New returns a network with no faults.
func New() *Network {
	return &Network{listeners: map[string]*listener{}, cut: map[link]bool{},
		delay: map[link]time.Duration{}, conns: map[*pipe]struct{}{}}
}

// Listen listens on name.
func (n *Network) Listen(name string) (net.Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.listeners[name]; ok {
		return nil, fmt.Errorf("faultnet: %s: address in use", name)
	}
	l := &listener{net: n, name: name, accept: make(chan net.Conn), done: make(chan struct{})}
	n.listeners[name] = l
	return l, nil
}

// Dialer returns the dial function of node from.
func (n *Network) Dialer(from string) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, to string) (net.Conn, error) { return n.dial(ctx, from, to) }
}

func (n *Network) dial(ctx context.Context, from, to string) (net.Conn, error) {
	n.mu.Lock()
	if n.cut[link{from, to}] && n.cut[link{to, from}] {
		n.mu.Unlock()
		return nil, fmt.Errorf("dial %s -> %s: %w", from, to, ErrUnreachable)
	}
	l := n.listeners[to]
	if l == nil {
		n.mu.Unlock()
		return nil, fmt.Errorf("dial %s -> %s: %w", from, to, ErrRefused)
	}
	n.seq++
	local := addr(fmt.Sprintf("%s:%d", from, n.seq))
	up := newPipe(n, link{from, to})
	down := newPipe(n, link{to, from})
	n.conns[up], n.conns[down] = struct{}{}, struct{}{}
	n.mu.Unlock()
	client := &conn{r: down, w: up, local: local, remote: addr(to)}
	server := &conn{r: up, w: down, local: addr(to), remote: local}
	select {
	case l.accept <- server:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("dial %s -> %s: %w", from, to, ErrRefused)
}

// Delay delays every write from -> to by d (0 removes the delay).
func (n *Network) Delay(from, to string, d time.Duration) {
	n.mu.Lock()
	n.delay[link{from, to}] = d
	n.mu.Unlock()
	n.wakeAll()
}

// Cut blackholes from -> to until Heal.
func (n *Network) Cut(from, to string) {
	n.mu.Lock()
	n.cut[link{from, to}] = true
	n.mu.Unlock()
}

// Partition cuts a and b apart both ways; dials between them fail.
func (n *Network) Partition(a, b string) {
	n.Cut(a, b)
	n.Cut(b, a)
}

// Heal removes the cuts between a and b, both ways: held bytes flow.
func (n *Network) Heal(a, b string) {
	n.mu.Lock()
	delete(n.cut, link{a, b})
	delete(n.cut, link{b, a})
	n.mu.Unlock()
	n.wakeAll()
}

// Drop resets every open connection between a and b.
func (n *Network) Drop(a, b string) {
	n.mu.Lock()
	var ps []*pipe
	for p := range n.conns {
		if p.link == (link{a, b}) || p.link == (link{b, a}) {
			ps = append(ps, p)
		}
	}
	n.mu.Unlock()
	for _, p := range ps {
		p.fail(errReset)
	}
}

// Stall holds every byte written from -> to on the connections open now
// until d from now, those written before included; bytes on connections
// dialled meanwhile flow. Order is kept.
func (n *Network) Stall(from, to string, d time.Duration) {
	until := time.Now().Add(d)
	n.mu.Lock()
	var ps []*pipe
	for p := range n.conns {
		if p.link == (link{from, to}) {
			ps = append(ps, p)
		}
	}
	n.mu.Unlock()
	for _, p := range ps {
		p.mu.Lock()
		p.stalled = until
		p.mu.Unlock()
		p.wakeUp()
	}
}

func (n *Network) isCut(l link) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut[l]
}

func (n *Network) delayOf(l link) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.delay[l]
}

func (n *Network) wakeAll() {
	n.mu.Lock()
	ps := make([]*pipe, 0, len(n.conns))
	for p := range n.conns {
		ps = append(ps, p)
	}
	n.mu.Unlock()
	for _, p := range ps {
		p.wakeUp()
	}
}

func (n *Network) forget(p *pipe) {
	n.mu.Lock()
	delete(n.conns, p)
	n.mu.Unlock()
}

type addr string

func (a addr) Network() string { return "faultnet" }
func (a addr) String() string  { return string(a) }

type listener struct {
	net    *Network
	name   string
	accept chan net.Conn
	done   chan struct{}
	once   sync.Once
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.accept:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.net.mu.Lock()
		delete(l.net.listeners, l.name)
		l.net.mu.Unlock()
	})
	return nil
}

func (l *listener) Addr() net.Addr { return addr(l.name) }

// chunk is one write, readable from at.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe is one direction of a connection.
type pipe struct {
	net  *Network
	link link

	mu       sync.Mutex
	q        []chunk
	eof      bool  // the writer closed: read what is queued, then io.EOF
	err      error // reset, or the reader closed: fails reads and writes at once
	wake     chan struct{}
	deadline time.Time // the reader's
	stalled  time.Time // nothing is readable before (Stall)
}

func newPipe(n *Network, l link) *pipe { return &pipe{net: n, link: l, wake: make(chan struct{})} }

// wakeUp makes a blocked reader look again; the caller must not hold p.mu.
func (p *pipe) wakeUp() {
	p.mu.Lock()
	close(p.wake)
	p.wake = make(chan struct{})
	p.mu.Unlock()
}

func (p *pipe) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	p.wakeUp()
	p.net.forget(p)
}

func (p *pipe) write(b []byte) (int, error) {
	at := time.Now().Add(p.net.delayOf(p.link))
	p.mu.Lock()
	if p.err != nil || p.eof {
		err := p.err
		p.mu.Unlock()
		if err == nil {
			err = net.ErrClosed
		}
		return 0, err
	}
	p.q = append(p.q, chunk{b: append([]byte(nil), b...), at: at})
	p.mu.Unlock()
	p.wakeUp()
	return len(b), nil
}

func (p *pipe) read(b []byte) (int, error) {
	for {
		cut := p.net.isCut(p.link)
		now := time.Now()
		p.mu.Lock()
		if p.err != nil {
			err := p.err
			p.mu.Unlock()
			return 0, err
		}
		if !p.deadline.IsZero() && !now.Before(p.deadline) {
			p.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		var until time.Time
		if len(p.q) > 0 && !cut {
			if c := &p.q[0]; !now.Before(c.at) && !now.Before(p.stalled) {
				n := copy(b, c.b)
				if c.b = c.b[n:]; len(c.b) == 0 {
					p.q = p.q[1:]
				}
				p.mu.Unlock()
				return n, nil
			}
			until = later(p.q[0].at, p.stalled)
		}
		if len(p.q) == 0 && p.eof {
			if !now.Before(p.stalled) {
				p.mu.Unlock()
				return 0, io.EOF
			}
			until = p.stalled // the end of the stream is held too
		}
		if !p.deadline.IsZero() && (until.IsZero() || p.deadline.Before(until)) {
			until = p.deadline
		}
		wake := p.wake
		p.mu.Unlock()
		var timer <-chan time.Time
		if !until.IsZero() {
			t := time.NewTimer(time.Until(until))
			timer = t.C
			select {
			case <-wake:
			case <-timer:
			}
			t.Stop()
			continue
		}
		<-wake
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (p *pipe) setDeadline(t time.Time) {
	p.mu.Lock()
	p.deadline = t
	p.mu.Unlock()
	p.wakeUp()
}

// conn is one end: it reads r and writes w.
type conn struct {
	r, w          *pipe
	local, remote addr
	once          sync.Once
}

func (c *conn) Read(b []byte) (int, error)  { return c.r.read(b) }
func (c *conn) Write(b []byte) (int, error) { return c.w.write(b) }

// Close ends both directions: the peer reads what was sent, then EOF.
func (c *conn) Close() error {
	c.once.Do(func() {
		c.w.mu.Lock()
		c.w.eof = true
		c.w.mu.Unlock()
		c.w.wakeUp()
		c.r.fail(net.ErrClosed)
		c.w.net.forget(c.w)
	})
	return nil
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

func (c *conn) SetDeadline(t time.Time) error     { c.r.setDeadline(t); return nil }
func (c *conn) SetReadDeadline(t time.Time) error { c.r.setDeadline(t); return nil }

// SetWriteDeadline is accepted and has no effect: writes never block.
func (c *conn) SetWriteDeadline(time.Time) error { return nil }
