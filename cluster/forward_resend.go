package cluster

import (
	"log/slog"
	"time"
)

// fwdResendAfter is how long a forwarder's oldest append may go
// unanswered on a connection before the forwarder dials the leader again
// to send it on a new one (forward_dedup.go): about a second beyond the
// commit a leader answers within (a follower's fetch round trip, the
// fetch long poll of 500 ms at most). Each further resend since the last
// answer waits twice as long, so a leader that is only slow to commit
// (its ISR shrinking around a cut follower) gets the appends at most a
// few times.
const fwdResendAfter = time.Second

// dedupsForwards reports whether node id's leaders answer a forward sent
// again as they answered its first copy (tagDedup): a leader that
// predates it would append it twice.
func (n *Node) dedupsForwards(id string) bool {
	m, ok := n.member(id)
	return ok && m.Tags[tagDedup] != ""
}

// maybeResend starts redial when c's oldest append has gone unanswered
// for fwdResendAfter (doubled per resend since the last answer), counted
// from when it was sent or c was made, whichever is later, and the
// leader remembers forwards.
func (f *forwarder) maybeResend(c *fwdConn) {
	f.mu.Lock()
	if f.mu.conn != c || len(f.mu.inflight) == 0 || f.mu.redialing ||
		time.Since(later(f.mu.inflight[0].sent, c.since)) < fwdResendAfter<<min(f.mu.resends, 4) {
		f.mu.Unlock()
		return
	}
	f.mu.Unlock()
	if !f.s.l.node.dedupsForwards(f.leader) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.conn != c || len(f.mu.inflight) == 0 || f.mu.redialing {
		return
	}
	f.mu.redialing = true
	f.wg.Add(1)
	go f.redial(c, f.mu.inflight[0])
}

// stillOldest reports whether r is still the oldest append unanswered
// on c, the connection.
func (f *forwarder) stillOldest(c *fwdConn, r *fwdReq) bool {
	return f.mu.conn == c && len(f.mu.inflight) > 0 && f.mu.inflight[0] == r
}

// redial dials the leader until a connection connects, then gives c up
// for it (resend). It stops once r, the oldest append unanswered on c
// when it began, is answered or due, c is given up, or f stops. Each
// try is bounded by probeWait, so that a try begun in a cut does not
// outlast it (a dial's own SYN is sent again only after a second).
func (f *forwarder) redial(c *fwdConn, r *fwdReq) {
	defer f.wg.Done()
	defer func() {
		f.mu.Lock()
		f.mu.redialing = false
		f.mu.Unlock()
	}()
	due := r.sent.Add(f.timeout)
	for {
		f.mu.Lock()
		live := f.stillOldest(c, r)
		f.mu.Unlock()
		if !live || !time.Now().Before(due) {
			return
		}
		try := time.Now().Add(f.probeWait)
		if due.Before(try) {
			try = due
		}
		conn, err := f.dialBy(try)
		if err == nil {
			f.resend(c, newFwdConn(conn), r)
			return
		}
		select { // a dial refused at once is not tried again at once
		case <-f.stop:
			return
		case <-c.dead:
			return
		case <-time.After(time.Until(try)):
		}
	}
}

// resend gives c up for nc if r is still the oldest append unanswered on
// it: the appends unanswered on c go back to the head of the queue, to
// be sent again on nc, which run takes next.
func (f *forwarder) resend(c, nc *fwdConn, r *fwdReq) {
	f.mu.Lock()
	if f.mu.failed || !f.stillOldest(c, r) {
		f.mu.Unlock()
		nc.Close()
		return
	}
	n := len(f.mu.inflight)
	f.mu.queue = append(f.mu.inflight, f.mu.queue...)
	f.mu.inflight, f.mu.conn = nil, nil
	f.mu.spare = nc
	f.mu.resends++
	close(c.dead)
	f.mu.Unlock()
	f.s.l.log.Info("cluster: the connection to the stream's leader went silent: sending its unanswered appends again on a new one",
		slog.String("stream", f.s.name), slog.String("leader", f.leader), slog.Int("appends", n),
		slog.Duration("unanswered", time.Since(r.sent)))
	signal(f.sig)
	c.Close() // after the swap: a TLS close may wait to send its alert
}

// takeSpare is the connection resend left for run, if any.
func (f *forwarder) takeSpare() *fwdConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.mu.spare
	f.mu.spare = nil
	return c
}
