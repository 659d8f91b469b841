package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/cluster/wire"
)

// rawCommand sends one CommandRequest to addr and returns the answer.
func rawCommand(t *testing.T, from *Node, addr string, req wire.CommandRequest) wire.CommandResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := from.dialer()(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var resp wire.CommandResponse
	c := &fetchConn{conn: conn, wait: 30 * time.Second}
	if err := c.roundTrip(wire.KindCommandRequest, req.AppendTo(nil), wire.KindCommandResponse, &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestSubmit_FromAnyNodeReachesTheController(t *testing.T) {
	s := startSite(t, partsOpts{Voters: 3, Serve: true})
	ctl := s.controller(s.nodes)
	s.registered(s.nodes)
	var other *Node
	for _, n := range s.nodes {
		if n != ctl {
			other = n
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A non-controller creates a stream: every node's state has it.
	if err := other.Submit(ctx, rules.CreateStream{Name: "s", Replicas: []string{"n1", "n2", "n3"}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range s.nodes {
		eventually(t, n.ID()+" sees the stream", func() bool {
			st, _ := n.State()
			return st.Streams["s"] != nil && len(st.Streams["s"].ISR) == 3
		})
	}

	// The state machine's refusal comes back typed.
	st, _ := other.State()
	stream := st.Streams["s"]
	err := other.Submit(ctx, rules.AlterISR{Name: "s", Leader: stream.Leader, LeaderEpoch: stream.LeaderEpoch,
		Version: stream.Version + 7, ISR: []rules.ISRMember{{ID: stream.Leader, Epoch: st.Brokers[stream.Leader].Epoch}}})
	if !errors.Is(err, ErrStaleVersion) {
		t.Fatalf("AlterISR with a stale version: %v, want ErrStaleVersion", err)
	}
	err = other.Submit(ctx, rules.AlterISR{Name: "s", Leader: stream.Leader, LeaderEpoch: stream.LeaderEpoch - 1,
		Version: stream.Version, ISR: []rules.ISRMember{{ID: stream.Leader, Epoch: st.Brokers[stream.Leader].Epoch}}})
	if !errors.Is(err, ErrStaleLeaderEpoch) {
		t.Fatalf("AlterISR with a stale leader epoch: %v, want ErrStaleLeaderEpoch", err)
	}

	data, err := rules.EncodeCommand(rules.ElectLeader{Name: "s"})
	if err != nil {
		t.Fatal(err)
	}
	// A node that is not the controller refuses, naming the controller.
	resp := rawCommand(t, ctl, s.servers[other].Addr(), wire.CommandRequest{From: ctl.ID(), BrokerEpoch: ctl.Epoch(), Command: data})
	if resp.Code != wire.NotController || resp.Controller != ctl.ID() {
		t.Fatalf("a non-controller answered %+v, want NotController naming %s", resp, ctl.ID())
	}
	// The controller refuses a submitter in a later Raft term (it would be
	// a deposed controller) and a submitter's old incarnation.
	resp = rawCommand(t, other, s.servers[ctl].Addr(), wire.CommandRequest{From: other.ID(), BrokerEpoch: other.Epoch(),
		Term: ctl.raft.CurrentTerm() + 1, Command: data})
	if resp.Code != wire.NotController {
		t.Fatalf("a request from a later term answered %+v, want NotController", resp)
	}
	resp = rawCommand(t, other, s.servers[ctl].Addr(), wire.CommandRequest{From: other.ID(), BrokerEpoch: other.Epoch() - 1,
		Term: other.raft.CurrentTerm(), Command: data})
	if resp.Code != wire.Refused || !errors.Is(commandErr(&resp), ErrStaleBrokerEpoch) {
		t.Fatalf("a request from an old broker epoch answered %+v, want a stale broker epoch refusal", resp)
	}

	// With the controller dead, Submit finds the new one.
	s.kill(ctl)
	live := without(s.nodes, ctl)
	if err := live[0].Submit(ctx, rules.CreateStream{Name: "s2", Replicas: []string{live[0].ID(), live[1].ID()}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range live {
		eventually(t, n.ID()+" sees s2", func() bool {
			st, _ := n.State()
			return st.Streams["s2"] != nil
		})
	}
}
