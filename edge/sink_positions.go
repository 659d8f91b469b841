package edge

import (
	"context"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/mqtt"
)

// brokerPositions keeps sink positions as the broker's consumer groups
// (mqtt/groups_api.go): "$sink.<name>" is a group like any other, stored
// with its stream and shown at $offsets/$sink.<name>/<stream>. The
// broker loads the configured streams' groups before it starts, so Load
// sees a position stored by an earlier run.
type brokerPositions struct{ b *mqtt.Broker }

var (
	_ sink.Positions = brokerPositions{}
	_ sink.Watcher   = brokerPositions{}
)

func (p brokerPositions) Load(group, stream string) (uint64, bool, error) {
	off, ok, _ := p.b.GroupOffset(group, stream)
	return off, ok, nil
}

// Commit returns once the offset is durable. The sink's own context ends
// only at shutdown, after which nothing commits, so none is needed here.
func (p brokerPositions) Commit(group, stream string, off uint64) error {
	return p.b.CommitGroup(context.Background(), group, stream, off)
}

// Watch follows the group's durable offset, which a client may also set
// by publishing to $offsets/<group>/<stream>.
func (p brokerPositions) Watch(group, stream string) (uint64, bool, <-chan struct{}) {
	return p.b.GroupOffset(group, stream)
}
