package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// forwarder passes one stream's appends to its leader (leader, epoch at
// addr), pipelined: a writer sends them in call order while up to
// fwdWindow are unanswered, a reader matches the answers, which come back
// in the same order.
//
// Each append sent must be answered within timeout of being sent. The
// oldest unanswered one sets the connection's read deadline, so answers
// that trickle in do not hold the ones behind them: past it the
// connection is given up (closed), every append sent on it and
// unanswered is refused as of unknown fate (an mqtt.Refusal wrapping
// ErrLeaderUnavailable that says to publish again: the leader may have
// stored it), and those queued and never sent go, in order, on a
// connection dialled at once. Nothing is sent twice by the forwarder, and
// nothing is reported done that the leader did not answer as done, so an
// append is never acknowledged at two offsets; a producer that publishes
// again after a refusal may duplicate (at least once).
//
// A connection that goes silent while a new one to the leader connects
// is given up sooner, without refusing anything: the appends unanswered
// on it are sent again on the new one, which the leader answers as it
// answered their first copies (forward_resend.go, forward_dedup.go).
//
// A dial that fails refuses what is queued (never sent: not stored) and
// ends the forwarder, as close does (the leader changed): the next append
// makes a new one, which looks the leader's address up again.
//
// While this node is cut off from the controller, an append unanswered
// for probeAfter makes the forwarder probe the leader (probe): a leader
// that does not answer within probeWait is behind the same cut, and the
// forwarder ends at once, refusing what it holds, where it would
// otherwise wait out the timeout; a dial made while cut off is bounded
// by probeWait too. A node that is only between controllers still
// reaches its leader and keeps forwarding.
type forwarder struct {
	s       *stream
	leader  string
	epoch   uint32
	addr    string
	timeout time.Duration // for an answer, from its append's sending
	// probeAfter and probeWait: Log.cutOffProbe.
	probeAfter, probeWait time.Duration

	sig  chan struct{} // cap 1: queued something, or an answer freed a slot
	sent chan struct{} // cap 1: sent something
	stop chan struct{}
	once sync.Once
	wg   *sync.WaitGroup // forwarding's: the stream's close waits for every forwarder

	mu struct {
		sync.Mutex
		queue    []*fwdReq // not sent yet, in call order
		inflight []*fwdReq // sent on conn, in order
		conn     *fwdConn  // nil between connections
		failed   bool      // no more appends: make a new forwarder
		probed   time.Time // when the last probe began
		probing  bool      // a probe is running
		// spare is a connection redial made for the appends of one that
		// went silent: run takes it instead of dialling.
		spare     *fwdConn
		redialing bool // redial runs
		// resends counts the connections given up for silence since the
		// last answer: each waits twice as long as the one before.
		resends int
	}
}

// fwdConn is one connection of a forwarder. dead is closed when it is
// given up, which ends its reader and sends the writer to dial the next.
type fwdConn struct {
	net.Conn
	dead  chan struct{}
	since time.Time // when it was made the forwarder's connection
}

type fwdReq struct {
	p    *pendingAppend
	recs []*logstore.Record
	body [][]byte
	seq  uint64    // the Seq it was first sent with (forward_dedup.go); 0 until then
	sent time.Time // when it was first taken to be sent: its answer is due timeout later
	// mirror, for a mirror stream's append, holds the records' source
	// offsets (sent with them); out gets the leader's result for each.
	mirror []MirrorRecord
	out    *mirrorOut
}

func newForwarder(s *stream, leader string, epoch uint32, addr string) *forwarder {
	f := &forwarder{s: s, leader: leader, epoch: epoch, addr: addr, timeout: s.l.forwardTimeout(),
		sig: make(chan struct{}, 1), sent: make(chan struct{}, 1), stop: make(chan struct{}), wg: &s.fwd.wg}
	f.probeAfter, f.probeWait = s.l.cutOffProbe()
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
// without waiting (wait: f.wg). Callers hold forwarding's mu: the failing
// runs on its own goroutine, since closing a TLS connection may wait to
// send its close alert.
func (f *forwarder) close() {
	f.once.Do(func() { close(f.stop) })
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.fail(fmt.Errorf("cluster: append to %s: forwarding to %s ended: %w", f.s.name, f.leader, mqtt.ErrLeaderUnavailable), fateEnded)
	}()
}

// fail marks f failed and answers every append: those queued with err
// (never sent, so not stored), those in flight with a refusal for why
// (their fate is unknown). The first failure closes the connection.
func (f *forwarder) fail(err error, why string) {
	f.mu.Lock()
	inflight, queue := f.mu.inflight, f.mu.queue
	f.mu.inflight, f.mu.queue = nil, nil
	f.mu.failed = true
	c, spare := f.mu.conn, f.mu.spare
	f.mu.conn, f.mu.spare = nil, nil
	if c != nil {
		close(c.dead)
	}
	f.mu.Unlock()
	if spare != nil {
		spare.Close()
	}
	f.once.Do(func() { close(f.stop) })
	for _, r := range inflight {
		f.s.settle(r.p, appendResult{err: mqtt.Refuse(why, err)})
	}
	for _, r := range queue {
		f.s.settle(r.p, appendResult{err: err})
	}
	if c != nil {
		c.Close()
	}
}

// broke gives c up after err, unless it was given up already: the
// appends sent on it and unanswered (answered first: taken off by the
// reader, then found wrong) are refused as of unknown fate, and the
// writer dials again for those queued.
func (f *forwarder) broke(c *fwdConn, err error, answered ...*fwdReq) {
	reqs := answered
	f.mu.Lock()
	if f.mu.conn == c {
		reqs = append(reqs, f.mu.inflight...)
		f.mu.inflight, f.mu.conn = nil, nil
		close(c.dead)
	}
	f.mu.Unlock()
	why := fateLost
	if errors.Is(err, os.ErrDeadlineExceeded) {
		why = fateTimeout
	}
	refusal := mqtt.Refuse(why, fmt.Errorf("cluster: append to %s: leader %s: %v: %w", f.s.name, f.leader, err, mqtt.ErrLeaderUnavailable))
	for _, r := range reqs {
		f.s.settle(r.p, appendResult{err: refusal})
	}
	c.Close() // after the refusals: a TLS close may wait to send its alert
}

// run dials when there is something to send, and sends on the
// connection until it is given up; then again while f is not failed.
func (f *forwarder) run() {
	defer f.wg.Done()
	for f.waitQueued() {
		if c := f.takeSpare(); c != nil {
			if !f.serve(c) {
				return
			}
			continue
		}
		cut := f.s.l.node.CutOff()
		c, err := f.dial(cut)
		switch {
		case err != nil && cut:
			f.s.fwd.unreachable(f)
			f.fail(fmt.Errorf("cluster: append to %s: dial leader %s: %v: %w", f.s.name, f.leader, err, errNodeCutOff), fateCutOff)
			return
		case err != nil:
			f.fail(fmt.Errorf("cluster: append to %s: dial leader %s: %v: %w", f.s.name, f.leader, err, mqtt.ErrLeaderUnavailable), fateLost)
			return
		}
		if !f.serve(c) {
			return
		}
	}
}

// serve makes c the connection and sends on it until it is given up:
// true to go on with another, false when f failed.
func (f *forwarder) serve(c *fwdConn) bool {
	f.mu.Lock()
	failed := f.mu.failed
	if !failed {
		f.mu.conn, c.since = c, time.Now()
	}
	f.mu.Unlock()
	if failed {
		c.Close()
		return false
	}
	f.wg.Add(1)
	go f.read(c)
	return f.write(c)
}

// waitQueued waits until an append is queued: false if f failed first.
func (f *forwarder) waitQueued() bool {
	for {
		f.mu.Lock()
		failed, queued := f.mu.failed, len(f.mu.queue) > 0
		f.mu.Unlock()
		switch {
		case failed:
			return false
		case queued:
			return true
		}
		select {
		case <-f.stop:
			return false
		case <-f.sig:
		}
	}
}

// dial connects to the leader within fwdDialTimeout, or within probeWait
// when this node is cut off (the dial is the probe).
func (f *forwarder) dial(cut bool) (*fwdConn, error) {
	wait := fwdDialTimeout
	if cut {
		wait = f.probeWait
	}
	conn, err := f.dialBy(time.Now().Add(wait))
	if err != nil {
		return nil, err
	}
	return newFwdConn(conn), nil
}

func newFwdConn(conn net.Conn) *fwdConn { return &fwdConn{Conn: conn, dead: make(chan struct{})} }

// dialBy connects to the leader by deadline, or fails once f stops.
func (f *forwarder) dialBy(deadline time.Time) (net.Conn, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	go func() {
		select {
		case <-f.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return f.s.l.node.dialer()(ctx, f.addr)
}

// write sends the queued appends on c in order while the window has room:
// true when c was given up (dial again), false when f failed.
func (f *forwarder) write(c *fwdConn) bool {
	// Frames are written through a buffer, flushed when the queue is
	// empty or the window full: a burst of appends costs a few writes.
	bw := bufio.NewWriterSize(c, 64<<10)
	var buf []byte
	// watch looks, every probeAfter while appends are unanswered, whether
	// the leader needs probing.
	var watch *time.Timer
	defer func() {
		if watch != nil {
			watch.Stop()
		}
	}()
	for {
		f.mu.Lock()
		failed, dead := f.mu.failed, f.mu.conn != c
		var r *fwdReq
		if !failed && !dead && watch == nil && len(f.mu.inflight) > 0 {
			watch = time.NewTimer(f.probeAfter)
		}
		if !failed && !dead && len(f.mu.queue) > 0 && len(f.mu.inflight) < fwdWindow {
			r = f.mu.queue[0]
			f.mu.queue[0] = nil
			f.mu.queue = f.mu.queue[1:]
			if r.seq == 0 { // not sent again: the leader knows it by its first Seq
				r.seq, r.sent = f.s.fwd.seq.next(), time.Now()
			}
			f.mu.inflight = append(f.mu.inflight, r)
		}
		f.mu.Unlock()
		switch {
		case failed:
			return false
		case dead:
			return true
		case r != nil:
			req := wire.ProduceRequest{Stream: f.s.name, From: f.s.l.node.ID(), LeaderEpoch: f.epoch, Seq: r.seq, Records: r.body}
			if r.mirror != nil {
				req.Mirror = mirrorPositions(r.mirror)
			}
			buf = req.AppendTo(buf[:0])
			_ = c.SetWriteDeadline(time.Now().Add(f.timeout))
			if err := wire.WriteFrame(bw, wire.KindProduceRequest, buf); err != nil {
				f.broke(c, err)
			} else if bw.Buffered() == 0 {
				signal(f.sent) // a frame larger than the buffer went through unbuffered
			}
			continue
		case bw.Buffered() > 0:
			_ = c.SetWriteDeadline(time.Now().Add(f.timeout))
			if err := bw.Flush(); err != nil {
				f.broke(c, err)
				continue
			}
			signal(f.sent)
			continue
		}
		var watched <-chan time.Time
		if watch != nil {
			watched = watch.C
		}
		select {
		case <-f.stop:
			return false
		case <-c.dead:
			return true
		case <-f.sig:
		case <-watched:
			watch = nil
			f.maybeProbe(c)
			f.maybeResend(c)
		}
	}
}

// read matches the leader's answers on c to the appends in flight, until
// c is given up.
func (f *forwarder) read(c *fwdConn) {
	defer f.wg.Done()
	br := bufio.NewReaderSize(c, 32<<10) // answers that came together are read without a deadline's look
	var buf []byte
	for {
		f.mu.Lock()
		live := f.mu.conn == c
		var oldest time.Time
		if live && len(f.mu.inflight) > 0 {
			oldest = f.mu.inflight[0].sent
		}
		f.mu.Unlock()
		if !live {
			return
		}
		if oldest.IsZero() {
			select {
			case <-c.dead:
				return
			case <-f.sent:
				continue
			}
		}
		// The oldest unanswered append sets the deadline, not the last
		// answer: a leader that answers now and then does not hold the
		// appends behind for a timeout each.
		_ = c.SetReadDeadline(oldest.Add(f.timeout))
		kind, body, err := wire.ReadFrame(br, buf)
		var resp wire.ProduceResponse
		if err == nil {
			buf = body[:0]
			if kind != wire.KindProduceResponse {
				err = fmt.Errorf("frame kind %d, want %d", kind, wire.KindProduceResponse)
			} else {
				err = resp.Decode(body)
			}
		}
		if err != nil {
			f.broke(c, err)
			return
		}
		f.mu.Lock()
		var r *fwdReq
		switch {
		case f.mu.conn != c:
			f.mu.Unlock()
			return // given up meanwhile: its appends are refused
		case len(f.mu.inflight) > 0 && f.mu.inflight[0].seq == resp.Seq:
			r = f.mu.inflight[0]
			f.mu.inflight[0] = nil
			f.mu.inflight = f.mu.inflight[1:]
			f.mu.resends = 0
		}
		f.mu.Unlock()
		if r == nil {
			f.broke(c, fmt.Errorf("answer %d out of order", resp.Seq))
			return
		}
		signal(f.sig) // a slot in the window is free
		res := appendResult{err: produceErr(f.s.name, &resp), at: time.Now()}
		if res.err == nil && r.mirror != nil {
			if res.end, err = r.mirrorAnswered(f.s.name, &resp); err != nil {
				f.broke(c, fmt.Errorf("mirror: %v", err), r)
				return
			}
		} else if res.err == nil {
			res.first, res.end = resp.First, resp.First+uint64(len(r.recs))
			for i, rec := range r.recs { // as the leader's appender set them
				rec.Offset, rec.Epoch = resp.First+uint64(i), f.epoch
			}
		}
		f.s.settle(r.p, res)
	}
}
