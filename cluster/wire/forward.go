package wire

import (
	"fmt"
	"math"
)

// Frame kinds of the data plane: a node that holds a replica of a stream
// but does not lead it passes its producers' appends, its consumers'
// state writes and claims to the leader, and follows the leader's
// consumer state.
const (
	KindProduceRequest     byte = 7
	KindProduceResponse    byte = 8
	KindStateWriteRequest  byte = 9
	KindStateWriteResponse byte = 10
	KindStateFetchRequest  byte = 11
	KindStateFetchResponse byte = 12
	KindClaimRequest       byte = 13
	KindClaimResponse      byte = 14
)

// ProduceRequest is one append forwarded to the stream's leader, the
// Seq-th on its connection (from 1). A connection that carries one is a
// produce pipeline from then on: requests are read without waiting for
// the answers, which come back in request order. Records are the
// cluster package's encoding of logstore records.
type ProduceRequest struct {
	Stream      string
	From        string
	LeaderEpoch uint32
	Seq         uint64
	Records     [][]byte
	// Mirror, for an append to a mirror stream, is each record's offset
	// in the source and the source's log start (2 values a record): the
	// leader applies the mirror rules at those offsets instead of
	// assigning its own. Empty for any other append, which then encodes
	// as before (5 fields); a leader that predates it refuses the frame
	// (6 fields), so it never takes a mirror record for a publish.
	Mirror []uint64
}

// ProduceResponse answers the request of the same Seq: First is the
// offset of its first record, or Code says why it was refused.
type ProduceResponse struct {
	Code    Code
	Seq     uint64
	First   uint64
	Message string
	// Results, answering a mirror append with Code None, is what became
	// of each record: MirrorAppended, MirrorDuplicate or MirrorRefused
	// (Message then says why the first refused one was). Empty otherwise
	// (4 fields, as before).
	Results []byte
}

// What became of a mirror record (ProduceResponse.Results).
const (
	MirrorAppended  byte = 0
	MirrorDuplicate byte = 1 // below the mirror's log end: not appended again
	MirrorRefused   byte = 2
)

// StateWriteRequest is a consumer-state write (puts, then deletes, one
// atomic step) forwarded to the stream's leader.
type StateWriteRequest struct {
	Stream      string
	LeaderEpoch uint32
	Puts        []KV
	Dels        []string
	// Node and BrokerEpoch name the writing node, for a write the leader
	// fences by the sessions' claims: the leader refuses it
	// (NotHolder) if a key it touches belongs to a claim that names
	// another node or epoch, or to none. Empty Node encodes as before
	// (4 fields) and is written unfenced; a leader that predates them
	// refuses the 6-field frame.
	Node        string
	BrokerEpoch uint64
}

// KV is one state entry.
type KV struct {
	Key string
	Val []byte
}

// StateWriteResponse is None once the leader's in-sync replicas hold the
// write.
type StateWriteResponse struct {
	Code    Code
	Message string
	// Moved, with NotHolder, are the keys of the write whose claim names
	// another node (nothing was written). Empty otherwise (2 fields, as
	// before): only a request naming its node is answered with it.
	Moved []string
}

// StateFetchRequest asks the stream's leader for its consumer state after
// version (Epoch, Seq), which the follower holds: the leader counts that
// as the follower's acknowledgement, and answers at once with the changes
// since, or waits up to MaxWaitMs for one (the long poll). A version of
// another leader epoch is answered with the whole state (Reset).
type StateFetchRequest struct {
	Stream      string
	ReplicaID   string
	LeaderEpoch uint32
	Epoch       uint32
	Seq         uint64
	MaxWaitMs   uint32
}

// StateFetchResponse brings the follower to version (Epoch, Seq): with
// Reset, Puts is the whole state (every other key goes); else Puts and
// Dels are the changes since the version asked.
type StateFetchResponse struct {
	Code  Code
	Epoch uint32
	Seq   uint64
	Reset bool
	Puts  []KV
	Dels  []string
}

// ClaimRequest asks the stream's leader to make Holder, a client of node
// Node in broker epoch BrokerEpoch, the single holder of Key (Release:
// give it up if Holder holds it).
type ClaimRequest struct {
	Stream      string
	LeaderEpoch uint32
	Key         string
	Holder      string
	Node        string
	BrokerEpoch uint64
	Release     bool
}

// ClaimResponse is the leader's answer: OK, or the Current holder.
type ClaimResponse struct {
	Code    Code
	OK      bool
	Current string
}

func (e *encoder) bool(b bool) {
	if b {
		e.uint(1)
	} else {
		e.uint(0)
	}
}

func (d *decoder) bool() (bool, error) {
	v, err := d.uint(1)
	return v == 1, err
}

func (e *encoder) kvs(kvs []KV) {
	e.array(2 * len(kvs))
	for _, kv := range kvs {
		e.str(kv.Key)
		e.bin(kv.Val)
	}
}

// kvs reads pairs; values are copied (they outlive the frame buffer).
func (d *decoder) kvs() ([]KV, error) {
	n, err := d.count()
	if err != nil {
		return nil, err
	}
	if n%2 != 0 {
		return nil, fmt.Errorf("wire: %d values in a key-value list", n)
	}
	var out []KV
	for range n / 2 {
		var kv KV
		if kv.Key, err = d.str(); err != nil {
			return nil, err
		}
		v, err := d.raw(false)
		if err != nil {
			return nil, err
		}
		kv.Val = append([]byte{}, v...)
		out = append(out, kv)
	}
	return out, nil
}

func (e *encoder) strs(ss []string) {
	e.array(len(ss))
	for _, s := range ss {
		e.str(s)
	}
}

func (d *decoder) strs() ([]string, error) {
	n, err := d.count()
	if err != nil {
		return nil, err
	}
	var out []string
	for range n {
		s, err := d.str()
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// AppendTo appends the request's body to dst.
func (m *ProduceRequest) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	if len(m.Mirror) > 0 {
		e.array(6)
	} else {
		e.array(5)
	}
	e.str(m.Stream)
	e.str(m.From)
	e.uint(uint64(m.LeaderEpoch))
	e.uint(m.Seq)
	e.array(len(m.Records))
	for _, r := range m.Records {
		e.bin(r)
	}
	if len(m.Mirror) > 0 {
		e.array(len(m.Mirror))
		for _, v := range m.Mirror {
			e.uint(v)
		}
	}
	return e.bytes()
}

// Decode reads a body AppendTo wrote. The records are sub-slices of b.
func (m *ProduceRequest) Decode(b []byte) error {
	d := newDecoder(b)
	var v ProduceRequest
	var le uint64
	fields, err := d.arrayOf(5, 6)
	if err == nil {
		v.Stream, err = d.str()
	}
	if err == nil {
		v.From, err = d.str()
	}
	if err == nil {
		le, err = d.uint(math.MaxUint32)
	}
	if err == nil {
		v.Seq, err = d.uint(math.MaxUint64)
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
	if err == nil && fields == 6 {
		var m int
		if m, err = d.count(); err == nil && (m == 0 || m != 2*n) {
			err = fmt.Errorf("wire: %d mirror positions for %d records", m, n)
		}
		for i := 0; err == nil && i < m; i++ {
			var u uint64
			if u, err = d.uint(math.MaxUint64); err == nil {
				v.Mirror = append(v.Mirror, u)
			}
		}
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("produce request: %w", err)
	}
	v.LeaderEpoch = uint32(le)
	*m = v
	return nil
}

// AppendTo appends the response's body to dst.
func (m *ProduceResponse) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	if len(m.Results) > 0 {
		e.array(5)
	} else {
		e.array(4)
	}
	e.uint(uint64(m.Code))
	e.uint(m.Seq)
	e.uint(m.First)
	e.str(m.Message)
	if len(m.Results) > 0 {
		e.bin(m.Results)
	}
	return e.bytes()
}

// Decode reads a body AppendTo wrote.
func (m *ProduceResponse) Decode(b []byte) error {
	d := newDecoder(b)
	var v ProduceResponse
	var code uint64
	fields, err := d.arrayOf(4, 5)
	if err == nil {
		code, err = d.uint(math.MaxUint8)
	}
	if err == nil {
		v.Seq, err = d.uint(math.MaxUint64)
	}
	if err == nil {
		v.First, err = d.uint(math.MaxUint64)
	}
	if err == nil {
		v.Message, err = d.str()
	}
	if err == nil && fields == 5 {
		var r []byte
		if r, err = d.raw(false); err == nil {
			v.Results = append([]byte(nil), r...)
		}
		for _, x := range v.Results {
			if x > MirrorRefused {
				err = fmt.Errorf("wire: mirror result %d", x)
			}
		}
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("produce response: %w", err)
	}
	v.Code = Code(code)
	*m = v
	return nil
}

// AppendTo appends the request's body to dst.
func (m *StateWriteRequest) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	if m.Node != "" {
		e.array(6)
	} else {
		e.array(4)
	}
	e.str(m.Stream)
	e.uint(uint64(m.LeaderEpoch))
	e.kvs(m.Puts)
	e.strs(m.Dels)
	if m.Node != "" {
		e.str(m.Node)
		e.uint(m.BrokerEpoch)
	}
	return e.bytes()
}

// Decode reads a body AppendTo wrote; values are copied.
func (m *StateWriteRequest) Decode(b []byte) error {
	d := newDecoder(b)
	var v StateWriteRequest
	var le uint64
	fields, err := d.arrayOf(4, 6)
	if err == nil && fields == 5 {
		err = fmt.Errorf("wire: 5 fields, want 4 or 6")
	}
	if err == nil {
		v.Stream, err = d.str()
	}
	if err == nil {
		le, err = d.uint(math.MaxUint32)
	}
	if err == nil {
		v.Puts, err = d.kvs()
	}
	if err == nil {
		v.Dels, err = d.strs()
	}
	if err == nil && fields == 6 {
		if v.Node, err = d.str(); err == nil && v.Node == "" {
			err = fmt.Errorf("wire: an empty writing node")
		}
	}
	if err == nil && fields == 6 {
		v.BrokerEpoch, err = d.uint(math.MaxUint64)
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("state write request: %w", err)
	}
	v.LeaderEpoch = uint32(le)
	*m = v
	return nil
}

// AppendTo appends the response's body to dst.
func (m *StateWriteResponse) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	if len(m.Moved) > 0 {
		e.array(3)
	} else {
		e.array(2)
	}
	e.uint(uint64(m.Code))
	e.str(m.Message)
	if len(m.Moved) > 0 {
		e.strs(m.Moved)
	}
	return e.bytes()
}

// Decode reads a body AppendTo wrote.
func (m *StateWriteResponse) Decode(b []byte) error {
	d := newDecoder(b)
	var v StateWriteResponse
	var code uint64
	fields, err := d.arrayOf(2, 3)
	if err == nil {
		code, err = d.uint(math.MaxUint8)
	}
	if err == nil {
		v.Message, err = d.str()
	}
	if err == nil && fields == 3 {
		if v.Moved, err = d.strs(); err == nil && len(v.Moved) == 0 {
			err = fmt.Errorf("wire: an empty list of moved keys")
		}
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("state write response: %w", err)
	}
	v.Code = Code(code)
	*m = v
	return nil
}

// AppendTo appends the request's body to dst.
func (m *StateFetchRequest) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(6)
	e.str(m.Stream)
	e.str(m.ReplicaID)
	e.uint(uint64(m.LeaderEpoch))
	e.uint(uint64(m.Epoch))
	e.uint(m.Seq)
	e.uint(uint64(m.MaxWaitMs))
	return e.bytes()
}

// Decode reads a body AppendTo wrote.
func (m *StateFetchRequest) Decode(b []byte) error {
	d := newDecoder(b)
	var v StateFetchRequest
	var u [4]uint64
	err := d.array(6)
	if err == nil {
		v.Stream, err = d.str()
	}
	if err == nil {
		v.ReplicaID, err = d.str()
	}
	for i, max := range []uint64{math.MaxUint32, math.MaxUint32, math.MaxUint64, math.MaxUint32} {
		if err == nil {
			u[i], err = d.uint(max)
		}
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("state fetch request: %w", err)
	}
	v.LeaderEpoch, v.Epoch, v.Seq, v.MaxWaitMs = uint32(u[0]), uint32(u[1]), u[2], uint32(u[3])
	*m = v
	return nil
}

// AppendTo appends the response's body to dst.
func (m *StateFetchResponse) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(6)
	e.uint(uint64(m.Code))
	e.uint(uint64(m.Epoch))
	e.uint(m.Seq)
	e.bool(m.Reset)
	e.kvs(m.Puts)
	e.strs(m.Dels)
	return e.bytes()
}

// Decode reads a body AppendTo wrote; values are copied.
func (m *StateFetchResponse) Decode(b []byte) error {
	d := newDecoder(b)
	var v StateFetchResponse
	var code, ep uint64
	err := d.array(6)
	if err == nil {
		code, err = d.uint(math.MaxUint8)
	}
	if err == nil {
		ep, err = d.uint(math.MaxUint32)
	}
	if err == nil {
		v.Seq, err = d.uint(math.MaxUint64)
	}
	if err == nil {
		v.Reset, err = d.bool()
	}
	if err == nil {
		v.Puts, err = d.kvs()
	}
	if err == nil {
		v.Dels, err = d.strs()
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("state fetch response: %w", err)
	}
	v.Code, v.Epoch = Code(code), uint32(ep)
	*m = v
	return nil
}

// AppendTo appends the request's body to dst.
func (m *ClaimRequest) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(7)
	e.str(m.Stream)
	e.uint(uint64(m.LeaderEpoch))
	e.str(m.Key)
	e.str(m.Holder)
	e.str(m.Node)
	e.uint(m.BrokerEpoch)
	e.bool(m.Release)
	return e.bytes()
}

// Decode reads a body AppendTo wrote.
func (m *ClaimRequest) Decode(b []byte) error {
	d := newDecoder(b)
	var v ClaimRequest
	var le uint64
	err := d.array(7)
	if err == nil {
		v.Stream, err = d.str()
	}
	if err == nil {
		le, err = d.uint(math.MaxUint32)
	}
	if err == nil {
		v.Key, err = d.str()
	}
	if err == nil {
		v.Holder, err = d.str()
	}
	if err == nil {
		v.Node, err = d.str()
	}
	if err == nil {
		v.BrokerEpoch, err = d.uint(math.MaxUint64)
	}
	if err == nil {
		v.Release, err = d.bool()
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("claim request: %w", err)
	}
	v.LeaderEpoch = uint32(le)
	*m = v
	return nil
}

// AppendTo appends the response's body to dst.
func (m *ClaimResponse) AppendTo(dst []byte) []byte {
	e := newEncoder(dst)
	e.array(3)
	e.uint(uint64(m.Code))
	e.bool(m.OK)
	e.str(m.Current)
	return e.bytes()
}

// Decode reads a body AppendTo wrote.
func (m *ClaimResponse) Decode(b []byte) error {
	d := newDecoder(b)
	var v ClaimResponse
	var code uint64
	err := d.array(3)
	if err == nil {
		code, err = d.uint(math.MaxUint8)
	}
	if err == nil {
		v.OK, err = d.bool()
	}
	if err == nil {
		v.Current, err = d.str()
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return fmt.Errorf("claim response: %w", err)
	}
	v.Code = Code(code)
	*m = v
	return nil
}
