package wire

// Frame kinds.
const (
	KindFetchRequest  byte = 1
	KindFetchResponse byte = 2
	KindEpochRequest  byte = 3
	KindEpochResponse byte = 4
)

// FetchRequest asks a stream's leader for the records from Offset on (the
// follower's log end), with the follower's view of the leader epoch (a
// stale one is refused) and its broker epoch. The leader answers at once
// when it has records past Offset or a high watermark above HighWatermark
// (the one the follower last heard), else waits up to MaxWaitMs for
// either (the long poll): followers learn the watermark without polling.
//
//wire:message
type FetchRequest struct {
	Stream        string
	ReplicaID     string
	BrokerEpoch   uint64
	LeaderEpoch   uint32
	Offset        uint64
	HighWatermark uint64
	MaxBytes      uint32
	MaxWaitMs     uint32
}

// FetchResponse carries the records from Base on (Records[i] is the stored
// value of offset Base+i), the leader's high watermark, log start and log
// end, or an error Code.
//
//wire:message
type FetchResponse struct {
	Code          Code
	LeaderEpoch   uint32
	HighWatermark uint64
	LogStart      uint64
	LogEnd        uint64
	Base          uint64
	Records       [][]byte
}

// EpochRequest asks where the leader's log of Epoch ends (KIP-101/279): a
// follower truncates there before it fetches after a leader change.
//
//wire:message
type EpochRequest struct {
	Stream      string
	ReplicaID   string
	LeaderEpoch uint32
	Epoch       uint32
}

// EpochResponse is the largest epoch at or below the one asked that the
// leader knows, and the offset where it ends.
//
//wire:message
type EpochResponse struct {
	Code      Code
	Epoch     uint32
	EndOffset uint64
}

// Command frame kinds: a node that is not the controller submits a
// controller command (cluster.EncodeCommand's bytes) to the one it
// believes is.
const (
	KindCommandRequest  byte = 5
	KindCommandResponse byte = 6
)

// CommandRequest carries one controller command from node From, running
// in BrokerEpoch, that knows the controller's Raft term Term. A receiver
// that is not the controller, or is in an older term than Term (a deposed
// controller that has not heard yet), answers NotController.
//
//wire:message
type CommandRequest struct {
	From        string
	BrokerEpoch uint64
	Term        uint64
	Command     []byte
}

// CommandResponse is None when the command is committed and applied;
// NotController with the receiver's idea of the controller's id; Refused
// with Refusal, the index of the state machine's reason (the cluster
// package's table), and Message; or Unknown with Message.
//
//wire:message
type CommandResponse struct {
	Code       Code
	Refusal    uint8
	Controller string
	Message    string
}

// Heartbeat frame kinds: every broker tells the controller, every
// heartbeat interval, that it is alive and hears the controller's Raft
// log (KRaft's broker heartbeat, KIP-631).
const (
	KindHeartbeatRequest  byte = 15
	KindHeartbeatResponse byte = 16
)

// HeartbeatRequest is broker From, running in BrokerEpoch, alive now;
// RaftContactMs is how long ago its Raft server last heard the
// controller (0 on the controller itself). A heartbeat from a broker
// whose copy of the state stopped following counts for nothing.
//
//wire:message
type HeartbeatRequest struct {
	From          string
	BrokerEpoch   uint64
	RaftContactMs uint64
}

// HeartbeatResponse is None when the controller counted the heartbeat,
// Refused when it did not (the sender's Raft has not heard it lately),
// NotController (naming the one the receiver knows) from any other node.
//
//wire:message
type HeartbeatResponse struct {
	Code       Code
	Controller string
}
