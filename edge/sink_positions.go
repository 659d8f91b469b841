package edge

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// brokerPositions keeps sink positions as the broker's consumer groups
// (mqtt/groups_api.go): "$sink.<name>" is a group like any other, stored
// with its stream (a $ group: MQTT clients cannot reach it). The
// broker loads the configured streams' groups before it starts, so Load
// sees a position stored by an earlier run.
type brokerPositions struct {
	b *mqtt.Broker
	// commits ends when the node's shutdown gives up on commits still
	// waiting (runners.stop).
	commits context.Context
}

var (
	_ sink.Positions = brokerPositions{}
	_ sink.Watcher   = brokerPositions{}
)

func (p brokerPositions) Load(group, stream string) (uint64, bool, error) {
	off, ok, _ := p.b.GroupOffset(group, stream)
	return off, ok, nil
}

// Commit returns once the offset is durable, or when the node's shutdown
// has waited commitGrace for it: in a site a commit the stream's ISR
// cannot take (the other replicas gone) would otherwise hold the
// shutdown for as long as it waits. A commit given up may still land; at
// worst the next run sends again what came after the durable position.
func (p brokerPositions) Commit(group, stream string, off uint64) error {
	return p.b.CommitGroup(p.commits, group, stream, off)
}

// Watch follows the group's durable offset, which the node may also set
// (Broker.CommitGroup).
func (p brokerPositions) Watch(group, stream string) (uint64, bool, <-chan struct{}) {
	return p.b.GroupOffset(group, stream)
}

// sitePositions are a site's sink positions: committed through the broker,
// which writes a group's offset through the stream's leader and answers
// once the stream's ISR holds it (cluster/log_state_leader.go), and loaded
// from this node's replica of the stream's state, not from the broker's
// memory. A node taking a stream up as its new leader (sink Leadership)
// holds every answered write there, while its broker may not have reloaded
// the stream's state yet (StateMoved): the memory could still show what
// this node knew as a follower.
type sitePositions struct {
	brokerPositions
	store *logstore.Store
}

var _ sink.Watcher = sitePositions{}

func (p sitePositions) Load(group, stream string) (uint64, bool, error) {
	st := p.store.Stream(stream)
	if st == nil {
		return 0, false, fmt.Errorf("load %s in %s: no such stream", group, stream)
	}
	key := mqtt.GroupStateKey(group)
	var off uint64
	found := false
	err := st.LoadState(key, func(k string, v []byte) error {
		if k != key { // a longer group name with this one as its prefix
			return nil
		}
		if len(v) != 8 {
			return fmt.Errorf("group state %q: %d bytes, want 8", k, len(v))
		}
		off, found = binary.BigEndian.Uint64(v), true
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("load %s in %s: %w", group, stream, err)
	}
	return off, found, nil
}
