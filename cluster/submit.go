package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/serf/serf"
	"github.com/peatmq/peat/cluster/rules"

	"github.com/peatmq/peat/cluster/wire"
)

// Commands from any node.
//
// Node.Submit has a command committed wherever the controller runs: applied
// locally on the controller, else sent as a CommandRequest frame (cluster/
// wire) to the Server of the node Raft names leader, at the cluster
// address its Serf tags advertise. The receiver applies it only if it is
// the controller in at least the submitter's Raft term (a deposed
// controller answers NotController, naming the one it knows) and the
// submitter's broker epoch is not older than the state's. NotController,
// no known controller and lost connections are retried with backoff until
// the context ends; the state machine's refusal comes back as the same
// typed error (ErrStaleVersion, ...), by an index into a table.

// refusals is the table a CommandResponse's Refusal indexes: the state
// machine's reasons, so that a submitter gets the same typed error as the
// controller (errors.Is). Append only: the index is on the wire.
var refusals = []error{
	ErrUnknownStream, ErrStreamExists, ErrUnknownBroker, ErrStaleBrokerEpoch,
	ErrStaleLeaderEpoch, ErrStaleVersion, ErrIneligibleReplica, ErrBadReplicas, ErrBadCommand,
	ErrBrokerAlive, ErrRemovedBroker,
	ErrStreamListed,
}

func refusalIndex(err error) (uint8, bool) {
	for i, r := range refusals {
		if errors.Is(err, r) {
			return uint8(i), true
		}
	}
	return 0, false
}

// isRefusal reports whether err is the state machine's answer (retrying
// the same command cannot succeed) rather than a failure to reach it.
func isRefusal(err error) bool {
	_, ok := refusalIndex(err)
	return ok
}

const (
	submitRetryMin = 50 * time.Millisecond
	submitRetryMax = time.Second
)

// Submit has c committed by the controller, wherever it runs: applied
// here when this node is the controller, else sent over the cluster
// transport to the controller Raft names (its address from Serf's tags).
// A receiver that is not the controller, a lost connection or no known
// controller are retried, with backoff, until ctx ends; the state
// machine's refusal is returned as the same typed error Apply returns.
func (n *Node) Submit(ctx context.Context, c rules.Command) error {
	data, err := rules.EncodeCommand(c)
	if err != nil {
		return err
	}
	backoff := submitRetryMin
	var last error
	for {
		if n.IsController() {
			last = n.Apply(ctx, c)
			if !errors.Is(last, ErrNotController) {
				return last
			}
		} else if addr := n.controllerAddr(); addr != "" {
			last = n.submitTo(ctx, addr, data)
			if last == nil || isRefusal(last) {
				return last
			}
		} else {
			last = errors.New("no controller known")
		}
		n.log.Debug("cluster: submit retry", slog.String("command", fmt.Sprintf("%T", c)), slog.Any("err", last))
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: submit %T: %w (last: %v)", c, ctx.Err(), last)
		case <-n.stop:
			return fmt.Errorf("cluster: submit %T: node closed (last: %v)", c, last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, submitRetryMax)
	}
}

// controllerAddr is the cluster address of the controller Raft names, ""
// when none is known or it advertises none.
func (n *Node) controllerAddr() string {
	id := n.Controller()
	if id == "" {
		return ""
	}
	return n.memberAddr(id)
}

// memberAddr is the cluster address member id advertises, "" if unknown.
func (n *Node) memberAddr(id string) string {
	m, _ := n.member(id)
	return m.Tags[tagCluster]
}

// member is Serf's member id, false if Serf does not know it.
func (n *Node) member(id string) (serf.Member, bool) {
	for _, m := range n.serf.Members() {
		if m.Name == id {
			return m, true
		}
	}
	return serf.Member{}, false
}

func (n *Node) dialer() Dialer {
	d := n.cfg.Dial
	if d == nil {
		d = TCPDialer
	}
	if n.tls != nil {
		return n.tls.dialer(d)
	}
	return d
}

// submitTo sends one command to addr and returns its answer as an error.
func (n *Node) submitTo(ctx context.Context, addr string, data []byte) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ApplyTimeout+time.Second)
	defer cancel()
	conn, err := n.dialer()(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	req := wire.CommandRequest{From: n.cfg.NodeID, BrokerEpoch: n.epoch, Term: n.raft.CurrentTerm(), Command: data}
	c := &fetchConn{conn: conn, wait: n.cfg.ApplyTimeout + time.Second}
	var resp wire.CommandResponse
	if err := c.roundTrip(wire.KindCommandRequest, req.AppendTo(nil), wire.KindCommandResponse, &resp); err != nil {
		return err
	}
	return commandErr(&resp)
}

// commandErr turns a response into the submitter's error.
func commandErr(resp *wire.CommandResponse) error {
	switch resp.Code {
	case wire.None:
		return nil
	case wire.Refused:
		if int(resp.Refusal) < len(refusals) {
			return fmt.Errorf("%w (%s)", refusals[resp.Refusal], resp.Message)
		}
		return fmt.Errorf("%w: refusal %d: %s", ErrBadCommand, resp.Refusal, resp.Message)
	case wire.NotController:
		return fmt.Errorf("%w (it names %q)", ErrNotController, resp.Controller)
	}
	return fmt.Errorf("cluster: command: %w: %s", resp.Code, resp.Message)
}

// handleCommand answers a CommandRequest: applied when this node is the
// controller in at least the submitter's Raft term, from a submitter
// whose broker epoch is not older than the state's.
func (n *Node) handleCommand(ctx context.Context, req *wire.CommandRequest) wire.CommandResponse {
	notController := wire.CommandResponse{Code: wire.NotController, Controller: n.Controller()}
	if !n.IsController() || req.Term > n.raft.CurrentTerm() {
		return notController // a deposed controller learns it at the next term
	}
	c, err := rules.DecodeCommand(req.Command)
	if err == nil {
		st, _ := n.fsm.State()
		if b := st.Brokers[req.From]; b != nil && req.BrokerEpoch < b.Epoch {
			err = fmt.Errorf("%w: %s submits in epoch %d, runs %d", ErrStaleBrokerEpoch, req.From, req.BrokerEpoch, b.Epoch)
		}
	}
	if err == nil {
		err = n.Apply(ctx, c)
	}
	if err == nil {
		return wire.CommandResponse{}
	}
	if i, ok := refusalIndex(err); ok {
		return wire.CommandResponse{Code: wire.Refused, Refusal: i, Message: err.Error()}
	}
	if errors.Is(err, ErrNotController) {
		return notController
	}
	return wire.CommandResponse{Code: wire.Unknown, Message: err.Error()}
}
