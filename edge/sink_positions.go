package edge

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/mqtt"
)

// statePositions keeps sink positions where mqtt keeps consumer group
// offsets (mqtt/groups.go): the state key "g/<group>/<stream>", 8
// big-endian bytes. A sink's group "$sink.<name>" is then a group like any
// other: after a restart $offsets/$sink.<name>/<stream> shows it.
//
// Until mqtt exposes its group registry, the broker learns these offsets
// only when it loads the state at start, so a live $offsets subscription
// does not see a sink's commits as they happen.
type statePositions struct{ st mqtt.StateStore }

var _ sink.Positions = statePositions{}

func groupStateKey(group, stream string) string { return "g/" + group + "/" + stream }

func (p statePositions) Load(group, stream string) (uint64, bool, error) {
	key := groupStateKey(group, stream)
	var off uint64
	var found bool
	err := p.st.LoadState(key, func(k string, v []byte) error {
		if k != key {
			return nil // a longer key with this prefix
		}
		if len(v) != 8 {
			return fmt.Errorf("group state %q: %d bytes, want 8", k, len(v))
		}
		off, found = binary.BigEndian.Uint64(v), true
		return nil
	})
	return off, found, err
}

func (p statePositions) Commit(group, stream string, off uint64) error {
	if group == "" || stream == "" {
		return errors.New("empty group or stream")
	}
	return p.st.WriteState(map[string][]byte{groupStateKey(group, stream): binary.BigEndian.AppendUint64(nil, off)}, nil)
}
