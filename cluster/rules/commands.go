package rules

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// A Command is one change to the controller's state, proposed by the
// controller (or a stream's leader, for AlterISR) and applied by every
// voter's state machine in Raft log order. An entry's data is one byte,
// the command's kind, then the command as msgpack.
type Command interface{ kind() byte }

const (
	kindRegisterBroker byte = 1 + iota
	kindBrokerFailed
	kindCreateStream
	kindAssignReplicas
	kindElectLeader
	kindAlterISR
	kindRemoveBroker
)

// Kinds are stored in Raft logs and snapshots' history: never renumber
// one. These carry explicit values so that kinds added beside them on
// other branches cannot shift them.
const (
	kindDrainBroker          byte = 16
	kindSetReplicationFactor byte = 17
	kindKeepBroker           byte = 18
	kindMoveReplicas         byte = 19
)

// RegisterBroker records that broker ID runs with Epoch (new on every
// start) and is alive. A higher epoch than the one known is a restart: the
// old incarnation's standing goes (it leaves every ISR it is not the last
// member of, and leads nothing until elected again).
type RegisterBroker struct {
	ID    string
	Epoch uint64
}

// BrokerFailed records that Serf declared broker ID, in Epoch, failed: it
// leaves every ISR at once (the last member stays, see Stream.ISR) and its
// streams elect new leaders. An epoch other than the broker's current one
// is stale and changes nothing.
type BrokerFailed struct {
	ID    string
	Epoch uint64
}

// CreateStream adds a stream on Replicas (the first alive one leads);
// every alive replica starts in the ISR, since all their logs are empty.
// Creating it again with the same replicas changes nothing.
// ReplicationFactor is how many replicas the stream should have (0: as
// many as Replicas): a site with fewer brokers creates it on those it
// has, and the controller adds replicas as brokers join (PlanMoves).
type CreateStream struct {
	Name              string
	Replicas          []string
	UncleanElection   bool
	ReplicationFactor int
}

// AssignReplicas moves a stream to another replica set that keeps at
// least one member of its ISR. A removed broker may stay in it (it is
// being moved out) but not be added.
type AssignReplicas struct {
	Name     string
	Replicas []string
}

// RemoveBroker records that broker ID has left the site for good (an
// operator's `peat cluster remove-node`, or cluster.replace_after): the
// controller moves its replicas to other brokers and takes it out of
// Raft's configuration. Refused while the broker is alive, or when it is
// the last member of a stream's ISR (it alone holds what was committed).
type RemoveBroker struct {
	ID string
}

// DrainBroker starts a live broker's decommission (`peat cluster
// remove-node` of a node that is alive): the controller moves its
// replicas to other brokers, add first and remove after, while it keeps
// serving; it leaves the controller's quorum as a voter (staying a
// non-voter that follows the state), is never given a replica again,
// and is removed (RemoveBroker) once it holds none and has stopped.
// Refused for a removed broker, or when a stream it holds could not
// keep its replication factor on the other brokers.
type DrainBroker struct {
	ID string
}

// KeepBroker ends a broker's drain (`peat cluster keep-node`): it may be
// given replicas again and, if its configuration makes it a voter, the
// controller adds it back to the quorum. The replicas that moved away
// stay where they are; a stream caught mid-move drops its extra replica
// as a lowered factor does. Refused for a removed broker (gone for good:
// its node registers as a new broker), a no-op for one not draining.
type KeepBroker struct {
	ID string
}

// SetReplicationFactor changes how many replicas a stream should have
// (its replication_factor changed in the configuration): the controller
// adds replicas on alive brokers, or drops the extra ones (never the
// leader, those outside the ISR first).
type SetReplicationFactor struct {
	Name              string
	ReplicationFactor int
}

// ElectLeader makes Preferred the stream's leader when it is alive and in
// the ISR; without Preferred it keeps an eligible leader, else elects one.
type ElectLeader struct {
	Name      string
	Preferred string
}

// AlterISR is a leader's request to set its stream's ISR: refused unless
// Leader, LeaderEpoch and Version are the stream's current ones (the
// compare-and-set that keeps a deposed leader from shrinking the ISR) and
// every member is an alive replica in the broker epoch given.
type AlterISR struct {
	Name        string
	Leader      string
	LeaderEpoch uint32
	Version     uint64
	ISR         []ISRMember
}

// ISRMember names a replica and the broker epoch in which it caught up.
type ISRMember struct {
	ID    string
	Epoch uint64
}

func (RegisterBroker) kind() byte { return kindRegisterBroker }
func (BrokerFailed) kind() byte   { return kindBrokerFailed }
func (CreateStream) kind() byte   { return kindCreateStream }
func (AssignReplicas) kind() byte { return kindAssignReplicas }
func (ElectLeader) kind() byte    { return kindElectLeader }
func (AlterISR) kind() byte       { return kindAlterISR }
func (RemoveBroker) kind() byte   { return kindRemoveBroker }

func (DrainBroker) kind() byte          { return kindDrainBroker }
func (SetReplicationFactor) kind() byte { return kindSetReplicationFactor }
func (KeepBroker) kind() byte           { return kindKeepBroker }

// EncodeCommand is the Raft entry data of c.
func EncodeCommand(c Command) ([]byte, error) {
	body, err := msgpack.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("cluster: encode command: %w", err)
	}
	return append([]byte{c.kind()}, body...), nil
}

// DecodeCommand reads what EncodeCommand wrote.
func DecodeCommand(b []byte) (Command, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrBadCommand)
	}
	var c Command
	var err error
	switch b[0] {
	case kindRegisterBroker:
		c, err = decodeAs[RegisterBroker](b[1:])
	case kindBrokerFailed:
		c, err = decodeAs[BrokerFailed](b[1:])
	case kindCreateStream:
		c, err = decodeAs[CreateStream](b[1:])
	case kindAssignReplicas:
		c, err = decodeAs[AssignReplicas](b[1:])
	case kindElectLeader:
		c, err = decodeAs[ElectLeader](b[1:])
	case kindAlterISR:
		c, err = decodeAs[AlterISR](b[1:])
	case kindRemoveBroker:
		c, err = decodeAs[RemoveBroker](b[1:])
	case kindDrainBroker:
		c, err = decodeAs[DrainBroker](b[1:])
	case kindSetReplicationFactor:
		c, err = decodeAs[SetReplicationFactor](b[1:])
	case kindKeepBroker:
		c, err = decodeAs[KeepBroker](b[1:])
	case kindMoveReplicas:
		c, err = decodeAs[MoveReplicas](b[1:])
	default:
		var ok bool
		if c, ok, err = decodeDeletion(b[0], b[1:]); !ok {
			return nil, fmt.Errorf("%w: kind %d", ErrBadCommand, b[0])
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: kind %d: %v", ErrBadCommand, b[0], err)
	}
	return c, nil
}

func decodeAs[T Command](b []byte) (Command, error) {
	var v T
	err := msgpack.Unmarshal(b, &v)
	return v, err
}

// EncodeState is a snapshot of s, as the controller's Raft snapshots
// store it.
func EncodeState(s *State) ([]byte, error) {
	b, err := msgpack.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("cluster: snapshot: %w", err)
	}
	return b, nil
}

// DecodeState reads what EncodeState wrote.
func DecodeState(b []byte) (*State, error) {
	st := NewState()
	if err := msgpack.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("cluster: restore: %w", err)
	}
	if st.Brokers == nil {
		st.Brokers = map[string]*Broker{}
	}
	if st.Streams == nil {
		st.Streams = map[string]*Stream{}
	}
	return st, nil
}
