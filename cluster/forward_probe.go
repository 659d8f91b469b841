package cluster

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/mqtt"
)

// A cut-off node's probe of a silent leader.
const (
	// A node cut off from the controller (Node.CutOff) whose forward has
	// gone unanswered for cutOffProbeAfter asks the leader a question
	// that needs no commit (the end of an epoch) on a new connection,
	// bounded by cutOffProbeWait. No answer means the leader is behind
	// the same cut: the forward is given up at once and, for
	// cutOffRefuseFor, so is any new append to that leader, rather than
	// each waiting out the forward timeout. An answer means the leader is
	// only slow (a controller election on its side too): the forward
	// waits as before. On a LAN the probe takes milliseconds.
	cutOffProbeAfter = 250 * time.Millisecond
	cutOffProbeWait  = 500 * time.Millisecond
	cutOffRefuseFor  = time.Second
)

// fateCutOff refuses an append sent to a leader found out of reach.
const fateCutOff = "this node is cut off from the site's controller and from the stream's leader; " +
	"the message may or may not be stored: publish again, through another node"

// errNodeCutOff refuses an append this node would forward to a leader it
// found out of reach while it is cut off from the controller: never sent,
// so not stored.
var errNodeCutOff = mqtt.Refuse("this node is cut off from the site's controller and from the stream's leader: publish through another node",
	mqtt.ErrLeaderUnavailable)

// cutOffProbe is when and for how long a cut-off node probes a leader
// that has not answered a forward: the defaults, or a test's.
func (l *Log) cutOffProbe() (after, wait time.Duration) {
	return cmp.Or(l.cfg.probeAfter, cutOffProbeAfter), cmp.Or(l.cfg.probeWait, cutOffProbeWait)
}

// unreachable notes that f, cut off, found its leader out of reach.
func (fw *forwarding) unreachable(f *forwarder) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.mu.unreached.leader, fw.mu.unreached.epoch, fw.mu.unreached.at = f.leader, f.epoch, time.Now()
}

// maybeProbe starts a probe of the leader when this node is cut off, the
// oldest append on c has gone unanswered for probeAfter, and no probe
// began in the last probeWait (a leader only slow is asked now and then).
func (f *forwarder) maybeProbe(c *fwdConn) {
	if !f.s.l.node.CutOff() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.conn != c || len(f.mu.inflight) == 0 || time.Since(f.mu.inflight[0].sent) < f.probeAfter ||
		f.mu.probing || time.Since(f.mu.probed) < f.probeWait {
		return
	}
	f.mu.probing, f.mu.probed = true, time.Now()
	f.wg.Add(1)
	go f.probe(c)
}

// probe asks the leader, on a connection of its own, where an epoch ends:
// a question it answers at once, with no commit to wait for. Unanswered
// within probeWait while this node is still cut off and c still waits
// for an answer, the leader is out of reach: f ends, refusing what it
// holds (errNodeCutOff for appends never sent, fateCutOff for those
// sent), and the stream's forwarding refuses new appends to that leader
// at once for a while.
func (f *forwarder) probe(c *fwdConn) {
	defer f.wg.Done()
	err := f.ask()
	f.mu.Lock()
	f.mu.probing = false
	live := f.mu.conn == c && len(f.mu.inflight) > 0
	f.mu.Unlock()
	if err == nil || !live || !f.s.l.node.CutOff() {
		return
	}
	f.s.l.log.Info("cluster: cut off from the controller and the stream's leader: refusing appends to forward",
		slog.String("stream", f.s.name), slog.String("leader", f.leader), slog.Any("err", err))
	f.s.fwd.unreachable(f)
	f.fail(fmt.Errorf("cluster: append to %s: leader %s did not answer a probe: %v: %w", f.s.name, f.leader, err, errNodeCutOff), fateCutOff)
}

// ask is probe's question: nil once the leader answered, whatever the answer.
func (f *forwarder) ask() error {
	deadline := time.Now().Add(f.probeWait)
	conn, err := f.dialBy(deadline)
	if err != nil {
		return err
	}
	defer conn.Close()
	pc := &fetchConn{conn: conn, wait: time.Until(deadline)}
	req := wire.EpochRequest{Stream: f.s.name, ReplicaID: f.s.l.node.ID(), LeaderEpoch: f.epoch}
	var resp wire.EpochResponse
	return pc.roundTrip(wire.KindEpochRequest, req.AppendTo(nil), wire.KindEpochResponse, &resp)
}
