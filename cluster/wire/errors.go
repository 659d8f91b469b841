package wire

import "fmt"

// Code is a response's error code.
type Code uint8

// The codes a leader answers with.
const (
	None               Code = iota
	UnknownStream           // no such stream here
	NotLeader               // this node does not lead the stream
	FencedLeaderEpoch       // the requester's leader epoch is older than the leader's
	UnknownLeaderEpoch      // the requester's leader epoch is newer: this leader has not heard of it yet
	OffsetOutOfRange        // the offset is below the log start or above the log end
	CorruptRecord           // the leader found a damaged record at the offset
	Unknown                 // anything else
	NotController           // this node is not the controller (or is behind the requester's term)
	Refused                 // the controller's state machine refused the command
	NotEnoughReplicas       // the ISR is below min_insync_replicas
	RecordTooLarge          // a record is larger than the leader's log takes
	NoSpace                 // the leader's disk is at its reserve
	Timeout                 // the leader gave up waiting for its in-sync replicas
	NotHolder               // a claim the write is fenced by names another node (StateWriteResponse.Moved)
)

var codeText = [...]string{
	None:               "none",
	UnknownStream:      "unknown stream",
	NotLeader:          "not the leader",
	FencedLeaderEpoch:  "fenced leader epoch",
	UnknownLeaderEpoch: "unknown leader epoch",
	OffsetOutOfRange:   "offset out of range",
	CorruptRecord:      "corrupt record",
	Unknown:            "unknown error",
	NotController:      "not the controller",
	Refused:            "command refused",
	NotEnoughReplicas:  "not enough in-sync replicas",
	RecordTooLarge:     "record too large",
	NoSpace:            "no space left on the leader",
	Timeout:            "timed out waiting for the in-sync replicas",
	NotHolder:          "claimed by another node",
}

func (c Code) Error() string {
	if int(c) < len(codeText) {
		return "wire: " + codeText[c]
	}
	return fmt.Sprintf("wire: code %d", c)
}

// Retriable reports whether the same request may succeed later, after the
// requester refreshed its view of the stream's leader (NotLeader, the
// epoch codes) or just waited.
func (c Code) Retriable() bool {
	switch c {
	case NotLeader, FencedLeaderEpoch, UnknownLeaderEpoch, UnknownStream, NotController:
		return true
	}
	return false
}

// Err is nil for None, else the code as an error.
func (c Code) Err() error {
	if c == None {
		return nil
	}
	return c
}
