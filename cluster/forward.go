package cluster

import (
	"errors"
	"fmt"
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
	// watermark until the leader drops it from the ISR, the session
	// timeout after its last fetch: appends forwarded meanwhile may be
	// refused as of unknown fate, and stored twice when published again.
	// That is the price of not holding every forward for as long as TCP
	// takes to notice a silent leader.
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
		// unreached is the leader and epoch a cut-off forwarder last found
		// out of reach, and when: appends to it are refused at once for
		// cutOffRefuseFor while this node stays cut off.
		unreached struct {
			leader string
			epoch  uint32
			at     time.Time
		}
	}
	wg  sync.WaitGroup // every forwarder's goroutines
	seq fwdSeq         // numbers the forwards (forward_dedup.go)
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
		if u := fw.mu.unreached; u.leader == leader && u.epoch == epoch && time.Since(u.at) < cutOffRefuseFor && s.l.node.CutOff() {
			return fmt.Errorf("cluster: %s %s: leader %s: %w", what, s.name, leader, errNodeCutOff)
		}
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
