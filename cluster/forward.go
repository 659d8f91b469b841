package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
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
	// DefaultForwardTimeout is LogConfig.ForwardTimeout with the default
	// session timeout: how long a forwarded append may go unanswered once
	// sent. A leader answers within a commit (a fetch round trip,
	// FetchMaxWait at most) while its ISR keeps up; a member cut off from
	// the controller is fenced after the session timeout and the leader
	// then answers, or is itself cut off and refuses: the session timeout
	// and a second. A member cut off from the leader alone holds the
	// watermark for replica_lag_max (10 s): appends forwarded meanwhile
	// are refused as of unknown fate, and may be stored twice when
	// published again. That is the price of not holding every forward for
	// as long as TCP takes to notice a silent leader.
	DefaultForwardTimeout = DefaultSessionTimeout + time.Second
	// fwdDialTimeout bounds a dial to the leader: appends waiting for it
	// were never sent, and are refused (not stored) when it fails.
	fwdDialTimeout = 2 * time.Second
	// rpcTimeout bounds a forwarded state write or claim.
	rpcTimeout = 15 * time.Second
	// fwdLocalWait bounds how long an append the leader committed waits
	// for this replica's watermark before it is answered anyway (a
	// replica that stopped fetching must not hold its producers): a
	// fetch round trip or two when all is well; the ISR holds the
	// records already, only reading them here waits.
	fwdLocalWait = 2 * time.Second
)

// Why an append sent to the leader and not answered is refused: the
// leader may have stored it, so the producer is told to publish again
// (at least once) rather than that it was not stored.
const (
	fateTimeout = "the stream's leader did not answer in time; the message may or may not be stored: publish again"
	fateLost    = "the connection to the stream's leader broke before it answered; the message may or may not be stored: publish again"
	fateEnded   = "forwarding to the stream's leader ended before it answered; the message may or may not be stored: publish again"
)

// forwardTimeout is LogConfig.ForwardTimeout or its default, the node's
// session timeout and a second.
func (l *Log) forwardTimeout() time.Duration {
	if l.cfg.ForwardTimeout > 0 {
		return l.cfg.ForwardTimeout
	}
	return l.node.cfg.SessionTimeout + time.Second
}

// forwarding is a follower's side of a stream's produce path: the
// forwarder to the leader the state names, made when an append needs
// one, replaced once when it has failed, ended when the state names
// another leader or epoch (check) or the stream closes (end). The stream
// hands it appends under the stream's mu, in call order, which is the
// order they are sent in; its own mu guards which forwarder is current.
type forwarding struct {
	s  *stream
	mu struct {
		sync.Mutex
		cur   *forwarder // nil: none needed yet, or ended
		ended bool       // the stream closed: no more forwarders
	}
	wg sync.WaitGroup // every forwarder's goroutines
}

// send queues r on the forwarder to the leader the state names, making
// one when there is none for that leader and epoch. r's append is
// refused (ErrLeaderUnavailable) when no other leader, or no address
// for it, is known, or a forwarder made anew fails at once too. what
// names the call in errors ("append to", "mirror").
func (fw *forwarding) send(r *fwdReq, what string) {
	if err := fw.add(r, what); err != nil {
		fw.s.settle(r.p, appendResult{err: err})
	}
}

func (fw *forwarding) add(r *fwdReq, what string) error {
	s := fw.s
	leader, epoch := s.stateLeaderID()
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.mu.ended {
		return fmt.Errorf("cluster: %s %s: %w", what, s.name, logstore.ErrClosed)
	}
	f := fw.mu.cur
	if f == nil || !f.usable(leader, epoch) {
		if f != nil {
			f.close()
			fw.mu.cur = nil
		}
		if leader == "" || leader == s.l.node.ID() {
			return fmt.Errorf("cluster: %s %s: no leader known to forward to: %w", what, s.name, mqtt.ErrLeaderUnavailable)
		}
		addr := s.l.node.memberAddr(leader) // Serf's member list: only when the leader changes
		if addr == "" {
			return fmt.Errorf("cluster: %s %s: no address known for leader %s: %w", what, s.name, leader, mqtt.ErrLeaderUnavailable)
		}
		f = newForwarder(s, leader, epoch, addr)
		fw.mu.cur = f
	}
	if f.add(r) {
		return nil
	}
	f.close()
	fw.mu.cur = newForwarder(s, f.leader, f.epoch, f.addr)
	if fw.mu.cur.add(r) {
		return nil
	}
	return fmt.Errorf("cluster: %s %s: forwarding to %s failed: %w", what, s.name, f.leader, mqtt.ErrLeaderUnavailable)
}

// check ends the forwarder whose leader the state no longer names: its
// unanswered appends are refused (ErrLeaderUnavailable). A leader that
// moved to another address fails the connection, and the next forwarder
// looks the address up again.
func (fw *forwarding) check() {
	leader, epoch := fw.s.stateLeaderID()
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if f := fw.mu.cur; f != nil && !f.usable(leader, epoch) {
		f.close()
		fw.mu.cur = nil
	}
}

// end refuses what the current forwarder holds and makes no more; wait
// on wg for their goroutines.
func (fw *forwarding) end() {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.mu.ended = true
	if f := fw.mu.cur; f != nil {
		f.close()
		fw.mu.cur = nil
	}
}

// newFwdReq encodes recs for the leader, stamping a zero timestamp with
// this node's clock.
func newFwdReq(what, stream string, recs []*logstore.Record) (*fwdReq, error) {
	r := &fwdReq{recs: recs, body: make([][]byte, len(recs))}
	now := time.Now().UnixMilli()
	size := 0
	for i, rec := range recs {
		if rec != nil && rec.Timestamp == 0 {
			rec.Timestamp = now // the broker clock of the node the producer reached
		}
		b, err := encodeFwdRecord(rec)
		if err != nil {
			return nil, fmt.Errorf("cluster: %s %s: %w", what, stream, err)
		}
		r.body[i] = b
		if size += len(b); size > wire.MaxFrame-64<<10 { // a frame carries the whole append
			return nil, fmt.Errorf("cluster: %s %s: %d bytes in one append: %w", what, stream, size, logstore.ErrRecordTooLarge)
		}
	}
	return r, nil
}

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
// A dial that fails refuses what is queued (never sent: not stored) and
// ends the forwarder, as close does (the leader changed): the next append
// makes a new one, which looks the leader's address up again.
type forwarder struct {
	s       *stream
	leader  string
	epoch   uint32
	addr    string
	timeout time.Duration // for an answer, from its append's sending

	sig  chan struct{} // cap 1: queued something, or an answer freed a slot
	sent chan struct{} // cap 1: sent something
	stop chan struct{}
	once sync.Once
	wg   *sync.WaitGroup // forwarding's: the stream's close waits for every forwarder

	mu struct {
		sync.Mutex
		queue    []*fwdReq // not sent yet, in call order
		inflight []*fwdReq // sent on conn, in order
		seq      uint64
		conn     *fwdConn // nil between connections
		failed   bool     // no more appends: make a new forwarder
	}
}

// fwdConn is one connection of a forwarder. dead is closed when it is
// given up, which ends its reader and sends the writer to dial the next.
type fwdConn struct {
	net.Conn
	dead chan struct{}
}

type fwdReq struct {
	p    *pendingAppend
	recs []*logstore.Record
	body [][]byte
	seq  uint64
	sent time.Time // when it was taken to be sent: its answer is due timeout later
	// mirror, for a mirror stream's append, holds the records' source
	// offsets (sent with them); out gets the leader's result for each.
	mirror []MirrorRecord
	out    *mirrorOut
}

func newForwarder(s *stream, leader string, epoch uint32, addr string) *forwarder {
	f := &forwarder{s: s, leader: leader, epoch: epoch, addr: addr, timeout: s.l.forwardTimeout(),
		sig: make(chan struct{}, 1), sent: make(chan struct{}, 1), stop: make(chan struct{}), wg: &s.fwd.wg}
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
	c := f.mu.conn
	f.mu.conn = nil
	if c != nil {
		close(c.dead)
	}
	f.mu.Unlock()
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
		c, err := f.dial()
		if err != nil {
			f.fail(fmt.Errorf("cluster: append to %s: dial leader %s: %v: %w", f.s.name, f.leader, err, mqtt.ErrLeaderUnavailable), fateLost)
			return
		}
		f.mu.Lock()
		failed := f.mu.failed
		if !failed {
			f.mu.conn = c
		}
		f.mu.Unlock()
		if failed {
			c.Close()
			return
		}
		f.wg.Add(1)
		go f.read(c)
		if !f.write(c) {
			return
		}
	}
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

func (f *forwarder) dial() (*fwdConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), fwdDialTimeout)
	defer cancel()
	go func() {
		select {
		case <-f.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := f.s.l.node.dialer()(ctx, f.addr)
	if err != nil {
		return nil, err
	}
	return &fwdConn{Conn: conn, dead: make(chan struct{})}, nil
}

// write sends the queued appends on c in order while the window has room:
// true when c was given up (dial again), false when f failed.
func (f *forwarder) write(c *fwdConn) bool {
	// Frames are written through a buffer, flushed when the queue is
	// empty or the window full: a burst of appends costs a few writes.
	bw := bufio.NewWriterSize(c, 64<<10)
	var buf []byte
	for {
		f.mu.Lock()
		failed, dead := f.mu.failed, f.mu.conn != c
		var r *fwdReq
		if !failed && !dead && len(f.mu.queue) > 0 && len(f.mu.inflight) < fwdWindow {
			r = f.mu.queue[0]
			f.mu.queue[0] = nil
			f.mu.queue = f.mu.queue[1:]
			f.mu.seq++
			r.seq, r.sent = f.mu.seq, time.Now()
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
		select {
		case <-f.stop:
			return false
		case <-c.dead:
			return true
		case <-f.sig:
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
// producer would have had there (errors.Is on the same sentinels). A
// leader's refusal in its own words (an mqtt.Refusal's reason: a message
// that is not an error's text, which starts "cluster:") reaches the
// producer as the same reason.
func produceErr(stream string, resp *wire.ProduceResponse) error {
	err := codeErr("append to", stream, resp.Code, resp.Message)
	if err != nil && resp.Message != "" && !strings.HasPrefix(resp.Message, "cluster:") {
		return &mqtt.Refusal{Reason: resp.Message, Err: err}
	}
	return err
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
