package source

import (
	"context"
	"errors"
	"time"

	"github.com/peatmq/peat/logstore"
)

// Defaults of Config.
const (
	DefaultBackoffMin = time.Second
	DefaultBackoffMax = 2 * time.Minute
	DefaultStallAfter = 60 * time.Second
	// DefaultAhead is how many batches from Next may wait to be durable
	// at once: Next is called again while earlier batches are appended.
	DefaultAhead = 16
)

// User properties the framework sets on every record a source appends
// (replacing any the upstream sent under these keys). They name where the
// record came from, for local subscribers (MQTT 5 deliveries carry them),
// for Scan, and for the sinks: a sink never sends a record back to the
// upstream named in PropOrigin (no echo).
const (
	PropSource = "peat-source" // the source's name
	PropOrigin = "peat-origin" // Upstream.Origin() of the upstream it came from
	// PropPrefix starts every other property the framework or a kind
	// writes: a kind's positions use it (PropPrefix + "mqtt-pid", ...).
	PropPrefix = "peat-source-"
)

// GroupPrefix starts the consumer group that holds a source's mark
// (Resume.Mark) in its stream: the source "cloud" has "$source.cloud",
// out of MQTT clients' reach as every group whose name starts with $.
const GroupPrefix = "$source."

// Group is the consumer group of the source named name.
func Group(name string) string { return GroupPrefix + name }

// Upstream is where a source pulls from: one per source, dialled again
// after every failure, by the node that leads the source's stream.
type Upstream interface {
	// Connect dials and returns once the upstream accepted the session.
	// r tells the connection what the log already holds of this source,
	// so that it resumes where the last durable record left off (the
	// kind's position is in its records) and recognises a redelivery
	// of what is already stored.
	Connect(ctx context.Context, r Resume) (Conn, error)
	// String names the upstream in logs and the API, without secrets.
	String() string
	// Origin names the upstream as a sink to the same place would name
	// itself (for MQTT "mqtt://host:port": the broker, whatever the
	// client id); the framework writes it in PropOrigin of every record.
	Origin() string
}

// Conn is one connection to an upstream. The framework calls Next from
// one goroutine and Done from another, each one call at a time, and
// Close once both have returned for good.
type Conn interface {
	// Next blocks until the upstream has messages, and returns them in
	// the upstream's order. An error ends the connection (the framework
	// closes it and dials again after a backoff); ctx ending is not a
	// failure of the upstream. Next may be called again before the
	// earlier batches are Done: at most Config.Ahead batches wait to be
	// durable at once, so a kind bounds what it holds unacknowledged by
	// its own flow control (an MQTT Receive Maximum, a fetch size).
	Next(ctx context.Context) ([]Message, error)
	// Done is called with every batch Next returned, in the order Next
	// returned them, once every record in it is committed in the log
	// (durable by the stream's durability; in a site, held by the ISR)
	// and holds its Offset: only then may the kind acknowledge the
	// messages upstream (MQTT PUBACK or PUBREC, a Kafka group commit).
	// A batch whose append failed is never Done: the framework ends the
	// connection instead, and the upstream delivers it again to the next
	// one. An error from Done ends the connection too.
	Done(msgs []Message) error
	// Close ends the connection and waits for its goroutines; what was
	// received and not Done is not acknowledged.
	Close() error
}

// Message is one upstream message on its way into the log.
type Message struct {
	// Record is appended to the source's stream as it is, with its topic
	// already mapped, its QoS and Retain as the upstream sent them (a
	// retained record becomes the topic's retained message here) and the
	// kind's position in its UserProperties (under PropPrefix), so the
	// position is durable in the same append as the record, and in a
	// site replicated with it. The framework adds PropSource and
	// PropOrigin. Nil: nothing to append (a redelivery the log already
	// holds), but Done still gets the message, in its place, so the kind
	// acknowledges it in order.
	Record *logstore.Record
	// Ack is the kind's own token (an MQTT packet id, a Kafka
	// partition): the framework hands it back in Done untouched.
	Ack uint64
	// Drop, with Record nil, names why the kind stores nothing of a
	// message it acknowledges all the same (peat_source_dropped_messages_total's
	// reason; "echo": a message this node's own sink sent up). Empty with
	// Record nil: a redelivery the log already holds.
	Drop string
}

// PropSink is the user property an MQTT 5 sink puts on what it sends to
// an upstream a source of the same node also pulls from, naming the
// sink's client id: that source drops what comes back down with it (no
// echo the other way round: a local publish sent up and brought down).
const PropSink = "peat-sink"

// Resume is what the log holds of a source, handed to each Connect. It
// reads the log of the node that leads the source's stream, which holds
// every committed record (in a site, whatever node wrote them before a
// failover).
type Resume interface {
	// Stream names the source's stream.
	Stream() string
	// End is the stream's committed end now: every record this source
	// appended on earlier connections is below it (the framework waits
	// for their appends before dialling again).
	End() uint64
	// Scan calls fn with the committed records of this source
	// (PropSource is its name) in its stream at offsets from and above,
	// newest first, until fn returns false or the record at from (or the
	// oldest one retention holds) was seen. The newest record with a
	// kind's position is where the source left off: every record before
	// it in the upstream's order is durable too. A scan reads every
	// record of the stream down to where it stops, the source's or not:
	// bound it with from (the Mark, say) where the kind can. Records are
	// shared with readers: do not modify them.
	Scan(ctx context.Context, from uint64, fn func(*logstore.Record) bool) error
	// WaitCommitted returns once every record the stream holds on this
	// node is committed. A new leader in a site may hold records of the
	// source that its predecessor wrote and the ISR does not hold yet:
	// End and Scan see committed records only, so a kind that resumes
	// from its records calls this first, or it would take those for
	// missing and bring them down again once they commit.
	WaitCommitted(ctx context.Context) error
	// Mark and SetMark keep one offset of the source's stream for a kind
	// that must remember more than its records say (MQTT QoS 2: the
	// records whose release, PUBREL, arrived). SetMark returns once the
	// mark is durable (and in a site held by the stream's ISR, so the
	// next leader reads it); ok is false until the first SetMark.
	Mark() (off uint64, ok bool, err error)
	SetMark(off uint64) error
}

// Lagger is a Conn that knows how far behind the upstream's end it is
// (Kafka: the high watermark less the next offset), for the API and
// metrics; ok is false while it does not know.
type Lagger interface {
	Lag() (records int64, ok bool)
}

// Reasoner is an error that names its reason for
// peat_source_errors_total (auth, protocol, ...); other errors count as
// "network", or "timeout" for a deadline.
type Reasoner interface{ Reason() string }

// Reason is err's label in peat_source_errors_total.
func Reason(err error) string {
	var r Reasoner
	switch {
	case errors.As(err, &r):
		return r.Reason()
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case err == nil:
		return "closed"
	}
	return "network"
}

// Leadership says whether this node runs the source: in a site, the
// node that leads the source's stream (the same interface, and the same
// value, as sink.Leadership). Without one a single node runs every
// source.
type Leadership interface {
	// Leader names the node that leads stream ("" while none is known),
	// the leader epoch it leads in, and whether this node runs that
	// leadership now.
	Leader(stream string) (leader string, epoch uint64, here bool)
	// Changed is closed when a leader may have changed; take it before
	// asking Leader.
	Changed() <-chan struct{}
}
