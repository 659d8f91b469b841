package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Produce forwarding limits.
const (
	// fwdWindow bounds the appends one forwarder has sent and not had
	// answered: enough to keep a LAN round trip and the leader's group
	// commit busy, without waiting for one batch before sending the next.
	// Each answer waits for the high watermark (a follower's fetch round
	// trip), so the window, not the link, sets the rate: 256 gave 1.5-4k
	// single-record appends/s through a follower of a three-node site in
	// one process on loopback, 2048 10-32k (the leader's own producers,
	// not bounded so: 50-200k). A burst of 5,000, on a busy 2-core machine.
	fwdWindow = 2048
	// fwdTimeout is how long an append in flight may go unanswered before
	// the connection is given up: longer than replica_lag_max's default,
	// after which a leader waiting on a dead follower answers.
	fwdTimeout = 30 * time.Second
	// rpcTimeout bounds a forwarded state write or claim.
	rpcTimeout = 15 * time.Second
	// fwdLocalWait bounds how long an append the leader committed waits
	// for this replica's watermark before it is answered anyway (a
	// replica that stopped fetching must not hold its producers).
	fwdLocalWait = 10 * time.Second
)

// forwarder passes one stream's appends to its leader (leader, epoch at
// addr) over one connection, pipelined: a writer goroutine sends them in
// call order while up to fwdWindow are unanswered, a reader matches the
// answers, which come back in the same order. Any failure of the
// connection, or close (the leader changed), answers everything unsent
// or unanswered with ErrLeaderUnavailable: the leader may still commit
// some of it (a retry then duplicates: at least once), but nothing is
// reported done that the leader did not answer as done.
type forwarder struct {
	s      *stream
	leader string
	epoch  uint32
	addr   string

	window chan struct{} // a slot per unanswered append
	sig    chan struct{} // cap 1: queued something
	sent   chan struct{} // cap 1: sent something
	stop   chan struct{}
	once   sync.Once
	wg     *sync.WaitGroup // the stream's: close waits for every forwarder

	mu struct {
		sync.Mutex
		queue    []*fwdReq // not sent yet
		inflight []*fwdReq // sent, in order
		seq      uint64
		conn     net.Conn
		failed   bool // no more appends: make a new forwarder
	}
}

type fwdReq struct {
	p    *pendingAppend
	recs []*logstore.Record
	body [][]byte
	seq  uint64
	// mirror, for a mirror stream's append, holds the records' source
	// offsets (sent with them); out gets the leader's result for each.
	mirror []MirrorRecord
	out    *mirrorOut
}

func newForwarder(s *stream, leader string, epoch uint32, addr string) *forwarder {
	f := &forwarder{s: s, leader: leader, epoch: epoch, addr: addr, window: make(chan struct{}, fwdWindow),
		sig: make(chan struct{}, 1), sent: make(chan struct{}, 1), stop: make(chan struct{}), wg: &s.fwds}
	f.wg.Add(1)
	go f.run()
	return f
}

// usable reports whether f still forwards to leader in epoch.
func (f *forwarder) usable(leader string, epoch uint32) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.mu.failed && f.leader == leader && f.epoch == epoch
}

// add queues an append; false if f failed (the caller makes a new one).
func (f *forwarder) add(r *fwdReq) bool {
	f.mu.Lock()
	if f.mu.failed {
		f.mu.Unlock()
		return false
	}
	f.mu.queue = append(f.mu.queue, r)
	f.mu.Unlock()
	signal(f.sig)
	return true
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// close fails what is queued or in flight and stops the goroutines
// without waiting (wait: f.wg). Callers hold the stream's mu: the failing
// runs on its own goroutine, since closing a TLS connection may wait to
// send its close alert.
func (f *forwarder) close() {
	f.once.Do(func() { close(f.stop) })
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.fail(fmt.Errorf("cluster: append to %s: forwarding to %s ended: %w", f.s.name, f.leader, mqtt.ErrLeaderUnavailable))
	}()
}

// fail answers every queued and unanswered append with err and marks f
// failed; the first failure closes the connection.
func (f *forwarder) fail(err error) {
	f.mu.Lock()
	reqs := append(f.mu.inflight, f.mu.queue...)
	f.mu.inflight, f.mu.queue = nil, nil
	f.mu.failed = true
	conn := f.mu.conn
	f.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	for _, r := range reqs {
		f.s.settle(r.p, appendResult{err: err})
	}
	f.once.Do(func() { close(f.stop) })
}

// run dials, then sends in order, and starts the reader.
func (f *forwarder) run() {
	defer f.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), fwdTimeout)
	go func() {
		select {
		case <-f.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := f.s.l.node.dialer()(ctx, f.addr)
	cancel()
	if err != nil {
		f.fail(fmt.Errorf("cluster: append to %s: dial leader %s: %v: %w", f.s.name, f.leader, err, mqtt.ErrLeaderUnavailable))
		return
	}
	f.mu.Lock()
	if f.mu.failed {
		f.mu.Unlock()
		conn.Close()
		return
	}
	f.mu.conn = conn
	f.mu.Unlock()
	f.wg.Add(1)
	go f.read(conn)
	// Frames are written through a buffer, flushed when the queue is
	// empty or the window full: a burst of appends costs a few writes.
	bw := bufio.NewWriterSize(conn, 64<<10)
	flush := func() bool {
		_ = conn.SetWriteDeadline(time.Now().Add(fwdTimeout))
		if err := bw.Flush(); err != nil {
			f.fail(fmt.Errorf("cluster: append to %s: send to leader %s: %v: %w", f.s.name, f.leader, err, mqtt.ErrLeaderUnavailable))
			return false
		}
		signal(f.sent)
		return true
	}
	var buf []byte
	for {
		select {
		case <-f.stop:
			return
		case <-f.sig:
		}
		for {
			f.mu.Lock()
			empty := f.mu.failed || len(f.mu.queue) == 0
			f.mu.Unlock()
			if empty {
				break
			}
			select { // a slot first: the reader frees one per answer
			case f.window <- struct{}{}:
			default:
				if !flush() {
					return
				}
				select {
				case f.window <- struct{}{}:
				case <-f.stop:
					return
				}
			}
			f.mu.Lock()
			if f.mu.failed || len(f.mu.queue) == 0 {
				f.mu.Unlock()
				<-f.window
				break
			}
			r := f.mu.queue[0]
			f.mu.queue = f.mu.queue[1:]
			f.mu.seq++
			r.seq = f.mu.seq
			f.mu.inflight = append(f.mu.inflight, r)
			f.mu.Unlock()
			req := wire.ProduceRequest{Stream: f.s.name, From: f.s.l.node.ID(), LeaderEpoch: f.epoch, Seq: r.seq, Records: r.body}
			if r.mirror != nil {
				req.Mirror = mirrorPositions(r.mirror)
			}
			buf = req.AppendTo(buf[:0])
			_ = conn.SetWriteDeadline(time.Now().Add(fwdTimeout))
			if err := wire.WriteFrame(bw, wire.KindProduceRequest, buf); err != nil {
				f.fail(fmt.Errorf("cluster: append to %s: send to leader %s: %v: %w", f.s.name, f.leader, err, mqtt.ErrLeaderUnavailable))
				return
			}
		}
		if !flush() {
			return
		}
	}
}

// read matches the leader's answers to the appends in flight.
func (f *forwarder) read(conn net.Conn) {
	defer f.wg.Done()
	var buf []byte
	for {
		f.mu.Lock()
		waiting := len(f.mu.inflight) > 0
		f.mu.Unlock()
		if !waiting {
			select {
			case <-f.stop:
				return
			case <-f.sent:
				continue
			}
		}
		_ = conn.SetReadDeadline(time.Now().Add(fwdTimeout))
		kind, body, err := wire.ReadFrame(conn, buf)
		var resp wire.ProduceResponse
		if err == nil {
			buf = body[:0]
			if kind != wire.KindProduceResponse {
				err = fmt.Errorf("frame kind %d, want %d", kind, wire.KindProduceResponse)
			} else {
				err = resp.Decode(body)
			}
		}
		var r *fwdReq
		if err == nil {
			f.mu.Lock()
			if len(f.mu.inflight) > 0 && f.mu.inflight[0].seq == resp.Seq {
				r = f.mu.inflight[0]
				f.mu.inflight = f.mu.inflight[1:]
			}
			f.mu.Unlock()
			if r == nil {
				err = fmt.Errorf("answer %d out of order", resp.Seq)
			}
		}
		if err != nil {
			f.fail(fmt.Errorf("cluster: append to %s: leader %s: %v: %w", f.s.name, f.leader, err, mqtt.ErrLeaderUnavailable))
			return
		}
		res := appendResult{err: produceErr(f.s.name, &resp), at: time.Now()}
		if res.err == nil && r.mirror != nil {
			if res.end, err = r.mirrorAnswered(f.s.name, &resp); err != nil {
				f.mu.Lock()
				f.mu.inflight = append([]*fwdReq{r}, f.mu.inflight...) // failed with the rest
				f.mu.Unlock()
				f.fail(fmt.Errorf("cluster: mirror %s: leader %s: %v: %w", f.s.name, f.leader, err, mqtt.ErrLeaderUnavailable))
				return
			}
			<-f.window
			f.s.settle(r.p, res)
			continue
		}
		<-f.window
		if res.err == nil {
			res.first, res.end = resp.First, resp.First+uint64(len(r.recs))
			for i, rec := range r.recs { // as the leader's appender set them
				rec.Offset, rec.Epoch = resp.First+uint64(i), f.epoch
			}
		}
		f.s.settle(r.p, res)
	}
}

// produceCode is the wire code for an append's error on the leader.
func produceCode(err error) wire.Code {
	switch {
	case err == nil:
		return wire.None
	case errors.Is(err, mqtt.ErrNotEnoughReplicas):
		return wire.NotEnoughReplicas
	case errors.Is(err, logstore.ErrRecordTooLarge):
		return wire.RecordTooLarge
	case errors.Is(err, logstore.ErrNoSpace):
		return wire.NoSpace
	case errors.Is(err, mqtt.ErrLeaderUnavailable), errors.Is(err, logstore.ErrClosed):
		return wire.NotLeader
	}
	return wire.Unknown
}

// produceErr turns the leader's answer into the error the local
// producer would have had there (errors.Is on the same sentinels).
func produceErr(stream string, resp *wire.ProduceResponse) error {
	return codeErr("append to", stream, resp.Code, resp.Message)
}

// codeErr turns a leader's code for an operation (what) on stream into
// the error a caller on the leader would have had.
func codeErr(what, stream string, code wire.Code, msg string) error {
	var base error
	switch code {
	case wire.None:
		return nil
	case wire.NotEnoughReplicas:
		base = mqtt.ErrNotEnoughReplicas
	case wire.RecordTooLarge:
		base = logstore.ErrRecordTooLarge
	case wire.NoSpace:
		base = logstore.ErrNoSpace
	case wire.NotLeader, wire.FencedLeaderEpoch, wire.UnknownLeaderEpoch, wire.UnknownStream, wire.Timeout:
		base = mqtt.ErrLeaderUnavailable
	default:
		return fmt.Errorf("cluster: %s %s: the leader refused: %w: %s", what, stream, code, msg)
	}
	return fmt.Errorf("cluster: %s %s: the leader answered %q: %w", what, stream, msg, base)
}

// rpcConn is a follower's connection to a stream's leader for forwarded
// state writes and claims, one request at a time, dialled again when the
// leader's address changes or a request fails.
type rpcConn struct {
	mu   sync.Mutex
	addr string
	conn net.Conn
	buf  []byte
}

func (c *rpcConn) call(ctx context.Context, dial Dialer, addr string, kind byte, body []byte, want byte, resp decoder) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil && c.addr != addr {
		c.conn.Close()
		c.conn = nil
	}
	if c.conn == nil {
		conn, err := dial(ctx, addr)
		if err != nil {
			return err
		}
		c.conn, c.addr = conn, addr
	}
	conn := c.conn
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	fc := &fetchConn{conn: conn, wait: rpcTimeout, buf: c.buf}
	err := fc.roundTrip(kind, body, want, resp)
	c.buf = fc.buf
	if err != nil {
		c.conn.Close()
		c.conn = nil
	}
	return err
}

func (c *rpcConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}
