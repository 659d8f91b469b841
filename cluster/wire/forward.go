package wire

import "fmt"

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

// ProduceRequest is one append forwarded to the stream's leader. Seq
// names it among the sending node's appends to the stream: a producer
// id in the high 32 bits (0 from a node that predates them) and a count
// in the low 32, rising in the order sent; an append sent again keeps
// its Seq, and the leader answers it as it answered the first copy. A
// connection that carries one is a produce pipeline from then on:
// requests are read without waiting for the answers, which come back in
// request order. Each of Records is a ProducedRecord's encoding.
//
//wire:message check
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
	Mirror []uint64 `wire:"opt"`
}

// ProduceResponse answers the request of the same Seq: First is the
// offset of its first record, or Code says why it was refused.
//
//wire:message check
type ProduceResponse struct {
	Code    Code
	Seq     uint64
	First   uint64
	Message string
	// Results, answering a mirror append with Code None, is what became
	// of each record: MirrorAppended, MirrorDuplicate or MirrorRefused
	// (Message then says why the first refused one was). Empty otherwise
	// (4 fields, as before).
	Results []byte `wire:"opt"`
}

// What became of a mirror record (ProduceResponse.Results).
const (
	MirrorAppended  byte = 0
	MirrorDuplicate byte = 1 // below the mirror's log end: not appended again
	MirrorRefused   byte = 2
)

// StateWriteRequest is a consumer-state write (puts, then deletes, one
// atomic step) forwarded to the stream's leader.
//
//wire:message
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
	Node        string `wire:"opt"`
	BrokerEpoch uint64
}

// KV is one state entry.
type KV struct {
	Key string
	Val []byte
}

// StateWriteResponse is None once the leader's in-sync replicas hold the
// write.
//
//wire:message
type StateWriteResponse struct {
	Code    Code
	Message string
	// Moved, with NotHolder, are the keys of the write whose claim names
	// another node (nothing was written). Empty otherwise (2 fields, as
	// before): only a request naming its node is answered with it.
	Moved []string `wire:"opt"`
}

// StateFetchRequest asks the stream's leader for its consumer state after
// version (Epoch, Seq), which the follower holds: the leader counts that
// as the follower's acknowledgement, and answers at once with the changes
// since, or waits up to MaxWaitMs for one (the long poll). A version of
// another leader epoch is answered with the whole state (Reset).
//
//wire:message
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
//
//wire:message
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
//
//wire:message
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
//
//wire:message
type ClaimResponse struct {
	Code    Code
	OK      bool
	Current string
}

// check refuses a mirror append whose positions do not pair with its
// records.
func (m *ProduceRequest) check() error {
	if len(m.Mirror) > 0 && len(m.Mirror) != 2*len(m.Records) {
		return fmt.Errorf("wire: %d mirror positions for %d records", len(m.Mirror), len(m.Records))
	}
	return nil
}

// check refuses a mirror result it does not know.
func (m *ProduceResponse) check() error {
	for _, x := range m.Results {
		if x > MirrorRefused {
			return fmt.Errorf("wire: mirror result %d", x)
		}
	}
	return nil
}
