package wire

import (
	"fmt"
	"math"
)

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
type EpochRequest struct {
	Stream      string
	ReplicaID   string
	LeaderEpoch uint32
	Epoch       uint32
}

// EpochResponse is the largest epoch at or below the one asked that the
// leader knows, and the offset where it ends.
type EpochResponse struct {
	Code      Code
	Epoch     uint32
	EndOffset uint64
}

// AppendTo appends the request's body to dst.
func (m *FetchRequest) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(8)
	e.str(m.Stream)
	e.str(m.ReplicaID)
	e.uint(m.BrokerEpoch)
	e.uint(uint64(m.LeaderEpoch))
	e.uint(m.Offset)
	e.uint(m.HighWatermark)
	e.uint(uint64(m.MaxBytes))
	e.uint(uint64(m.MaxWaitMs))
	return e.bytes()
}

// Decode reads a body AppendTo wrote; strings are copied.
func (m *FetchRequest) Decode(b []byte) error {
	d := newDecoder(b)
	var v FetchRequest
	var u [6]uint64
	err := d.array(8)
	if err == nil {
		v.Stream, err = d.str()
	}
	if err == nil {
		v.ReplicaID, err = d.str()
	}
	for i, max := range []uint64{math.MaxUint64, math.MaxUint32, math.MaxUint64, math.MaxUint64, math.MaxUint32, math.MaxUint32} {
		if err == nil {
			u[i], err = d.uint(max)
		}
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("fetch request: %w", err)
	}
	v.BrokerEpoch, v.LeaderEpoch, v.Offset, v.HighWatermark = u[0], uint32(u[1]), u[2], u[3]
	v.MaxBytes, v.MaxWaitMs = uint32(u[4]), uint32(u[5])
	*m = v
	return nil
}

// AppendTo appends the response's body to dst.
func (m *FetchResponse) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(7)
	e.uint(uint64(m.Code))
	e.uint(uint64(m.LeaderEpoch))
	e.uint(m.HighWatermark)
	e.uint(m.LogStart)
	e.uint(m.LogEnd)
	e.uint(m.Base)
	e.array(len(m.Records))
	for _, r := range m.Records {
		e.bin(r)
	}
	return e.bytes()
}

// Decode reads a body AppendTo wrote. The records are sub-slices of b.
func (m *FetchResponse) Decode(b []byte) error {
	d := newDecoder(b)
	var v FetchResponse
	var u [6]uint64
	err := d.array(7)
	for i, max := range []uint64{math.MaxUint8, math.MaxUint32, math.MaxUint64, math.MaxUint64, math.MaxUint64, math.MaxUint64} {
		if err == nil {
			u[i], err = d.uint(max)
		}
	}
	var n int
	if err == nil {
		n, err = d.count()
	}
	if err == nil && n > 0 {
		v.Records = make([][]byte, n)
		for i := range v.Records {
			if v.Records[i], err = d.raw(false); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("fetch response: %w", err)
	}
	v.Code, v.LeaderEpoch, v.HighWatermark, v.LogStart, v.LogEnd, v.Base = Code(u[0]), uint32(u[1]), u[2], u[3], u[4], u[5]
	*m = v
	return nil
}

// AppendTo appends the request's body to dst.
func (m *EpochRequest) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(4)
	e.str(m.Stream)
	e.str(m.ReplicaID)
	e.uint(uint64(m.LeaderEpoch))
	e.uint(uint64(m.Epoch))
	return e.bytes()
}

// Decode reads a body AppendTo wrote.
func (m *EpochRequest) Decode(b []byte) error {
	d := newDecoder(b)
	var v EpochRequest
	var le, ep uint64
	err := d.array(4)
	if err == nil {
		v.Stream, err = d.str()
	}
	if err == nil {
		v.ReplicaID, err = d.str()
	}
	if err == nil {
		le, err = d.uint(math.MaxUint32)
	}
	if err == nil {
		ep, err = d.uint(math.MaxUint32)
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("epoch request: %w", err)
	}
	v.LeaderEpoch, v.Epoch = uint32(le), uint32(ep)
	*m = v
	return nil
}

// AppendTo appends the response's body to dst.
func (m *EpochResponse) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(3)
	e.uint(uint64(m.Code))
	e.uint(uint64(m.Epoch))
	e.uint(m.EndOffset)
	return e.bytes()
}

// Decode reads a body AppendTo wrote.
func (m *EpochResponse) Decode(b []byte) error {
	d := newDecoder(b)
	var u [3]uint64
	err := d.array(3)
	for i, max := range []uint64{math.MaxUint8, math.MaxUint32, math.MaxUint64} {
		if err == nil {
			u[i], err = d.uint(max)
		}
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("epoch response: %w", err)
	}
	*m = EpochResponse{Code: Code(u[0]), Epoch: uint32(u[1]), EndOffset: u[2]}
	return nil
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
type CommandResponse struct {
	Code       Code
	Refusal    uint8
	Controller string
	Message    string
}

// AppendTo appends the request's body to dst.
func (m *CommandRequest) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(4)
	e.str(m.From)
	e.uint(m.BrokerEpoch)
	e.uint(m.Term)
	e.bin(m.Command)
	return e.bytes()
}

// Decode reads a body AppendTo wrote; the command is copied.
func (m *CommandRequest) Decode(b []byte) error {
	d := newDecoder(b)
	var v CommandRequest
	err := d.array(4)
	if err == nil {
		v.From, err = d.str()
	}
	if err == nil {
		v.BrokerEpoch, err = d.uint(math.MaxUint64)
	}
	if err == nil {
		v.Term, err = d.uint(math.MaxUint64)
	}
	if err == nil {
		v.Command, err = d.raw(false)
		v.Command = append([]byte(nil), v.Command...)
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("command request: %w", err)
	}
	*m = v
	return nil
}

// AppendTo appends the response's body to dst.
func (m *CommandResponse) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(4)
	e.uint(uint64(m.Code))
	e.uint(uint64(m.Refusal))
	e.str(m.Controller)
	e.str(m.Message)
	return e.bytes()
}

// Decode reads a body AppendTo wrote.
func (m *CommandResponse) Decode(b []byte) error {
	d := newDecoder(b)
	var v CommandResponse
	var code, refusal uint64
	err := d.array(4)
	if err == nil {
		code, err = d.uint(math.MaxUint8)
	}
	if err == nil {
		refusal, err = d.uint(math.MaxUint8)
	}
	if err == nil {
		v.Controller, err = d.str()
	}
	if err == nil {
		v.Message, err = d.str()
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("command response: %w", err)
	}
	v.Code, v.Refusal = Code(code), uint8(refusal)
	*m = v
	return nil
}
