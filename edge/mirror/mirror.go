package mirror

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/logstore"
)

// Prefix starts the topic a Peat sink publishes a record to: $mirror/<stream>,
// the mirror stream on the receiving node.
const Prefix = "$mirror/"

// User properties of a mirrored record, as the sender appends them after
// the record's own: the receiver takes them from the end of the list, so a
// record that already carries peat-* properties keeps its own.
const (
	PropStream = "peat-stream" // the source stream
	PropOffset = "peat-offset" // the record's offset in the source
	PropTime   = "peat-time"   // its timestamp, unix ms
	PropTopic  = "peat-topic"  // its topic
	PropClient = "peat-client" // the client that published it
	PropQoS    = "peat-qos"    // the QoS it was published with
	PropExpiry = "peat-expiry" // its message expiry, seconds from peat-time
	// PropFirst is the source stream's log start when the record was sent:
	// every offset below it is gone there, so the mirror may mark a gap
	// below it, and only there.
	PropFirst = "peat-first"
)

// Props is the order of the properties the sender appends.
var Props = []string{PropStream, PropOffset, PropTime, PropTopic, PropClient, PropQoS, PropExpiry, PropFirst}

// Gap markers: a record at each offset the source had dropped before it
// was sent, so the mirror's offsets stay the source's and a reader sees
// which offsets are missing, and why.
const (
	GapTopic = "$peat/gap"
	// PropGap on a marker is the missing range "<from>-<to>", to exclusive.
	PropGap = "peat-gap"
)

// maxBatch bounds the values of one AppendReplica (a long gap is written
// in pieces).
const maxBatch = 4096

// Incoming is one record received for a mirror stream: its offset in the
// source, the source's log start when it was sent, and the record. It is
// cluster's type, which carries it to a site's mirror leader.
type Incoming = cluster.MirrorRecord

// MissingError refuses a record that comes after records the mirror does
// not have while the source still does: a transport loss, not retention.
// The sender sends again from its position.
type MissingError struct {
	Stream      string
	Next, Got   uint64
	SourceFirst uint64
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("mirror %s: got offset %d, next is %d and the source still has %d..%d",
		e.Stream, e.Got, e.Next, max(e.SourceFirst, e.Next), e.Got-1)
}

// Result says what became of one Incoming (cluster's type too).
type Result = cluster.MirrorResult

const (
	Appended  = cluster.MirrorAppended
	Duplicate = cluster.MirrorDuplicate // below the mirror's log end: acknowledged, not appended
	Refused   = cluster.MirrorRefused   // with an error saying why
)

var _ cluster.MirrorApply = Apply

// Apply writes in, in order, into st at the source's offsets, and returns
// what became of each (with the error of those refused). Record N is
// appended only when N is st's next offset; N below it is a duplicate; N
// above it when the source's log start is at least N means the source
// dropped the records between before they were sent: a gap marker goes at
// each missing offset (or, on an empty mirror, the log starts at N). N
// above it otherwise is refused. Appends go through AppendReplica, which
// appends only at the log end, so no offset is ever given twice whatever
// else writes to st. Everything reported Appended or Duplicate is durable
// when Apply returns. What it appends carries epoch: 0 on a single node,
// the leader's epoch in a site (a replica's log refuses records of an
// older epoch than it holds, and truncates by them after a failover).
func Apply(ctx context.Context, st *logstore.Stream, epoch uint32, in []Incoming) ([]Result, []error) {
	res := make([]Result, len(in))
	errs := make([]error, len(in))
	next := st.NextOffset()
	base := next // the offset of vals[0]
	var vals [][]byte
	var waiting []int // indexes acknowledged once vals are written
	flush := func() error {
		if len(vals) == 0 {
			return nil
		}
		err := st.AppendReplica(ctx, base, vals)
		if err != nil {
			for _, i := range waiting {
				res[i], errs[i] = Refused, err
			}
		}
		vals, waiting, base = vals[:0], waiting[:0], next
		return err
	}
	fail := func(from int, err error) ([]Result, []error) {
		for i := from; i < len(in); i++ {
			res[i], errs[i] = Refused, err
		}
		return res, errs
	}
	for i, x := range in {
		switch {
		case x.Offset < next:
			res[i] = Duplicate
			if x.Offset >= base {
				waiting = append(waiting, i)
			}
			continue
		case x.Offset > next && x.First < x.Offset:
			res[i], errs[i] = Refused, &MissingError{Stream: st.Name(), Next: next, Got: x.Offset, SourceFirst: x.First}
			continue
		case x.Offset > next && len(vals) == 0 && st.FirstOffset() == next:
			// Nothing kept yet: the mirror starts where the source's
			// records start, as the source's own log start moved.
			if err := st.ResetTo(ctx, x.Offset); err != nil {
				return fail(i, err)
			}
			next, base = x.Offset, x.Offset
		}
		for from := next; next < x.Offset; {
			vals = append(vals, logstore.EncodeValue(marker(next, from, epoch, x)))
			next++
			if len(vals) >= maxBatch {
				if err := flush(); err != nil {
					return fail(i, err)
				}
			}
		}
		r := x.Record
		r.Offset, r.Epoch = x.Offset, epoch
		vals = append(vals, logstore.EncodeValue(r))
		waiting = append(waiting, i)
		res[i] = Appended
		next++
		if len(vals) >= maxBatch {
			if err := flush(); err != nil {
				return fail(i+1, err)
			}
		}
	}
	_ = flush()
	return res, errs
}

// marker is the gap marker at off, in the gap [from, x.Offset).
func marker(off, from uint64, epoch uint32, x Incoming) *logstore.Record {
	return &logstore.Record{
		Offset:         off,
		Epoch:          epoch,
		Timestamp:      x.Record.Timestamp,
		Topic:          GapTopic,
		UserProperties: []logstore.UserProperty{{Key: PropGap, Value: strconv.FormatUint(from, 10) + "-" + strconv.FormatUint(x.Offset, 10)}},
	}
}

// ErrNotMirror refuses $mirror/<name> when no mirror stream has that name.
var ErrNotMirror = errors.New("no mirror stream of that name")
