package mqtt

import (
	"context"
	"sync"
	"time"

	"github.com/peatmq/peat/logstore"
)

// Log is the offset log as the MQTT front-end sees it. On a single node the
// logstore satisfies it (through edge's adapter); in a cluster the cluster
// package will. mqtt never imports cluster: it only needs these few
// operations.
//
// The comments below are the whole contract: package mqtt/mqtttest/logtest
// checks every implementation against it (mqtttest.MemLog, the in-memory
// log mqtt's tests use, and the Badger-backed logstore), so a promise not
// written here is one the broker must not rely on.
//
// Errors wrap logstore's sentinels whatever the implementation, so callers
// test them with errors.Is: logstore.ErrClosed, ErrOffsetOutOfRange,
// ErrNilRecord, ErrRecordTooLarge, ErrNoSpace. A log has no Close here: its
// owner closes it, and the promises "after close" below are about that.
type Log interface {
	// Route returns the stream whose filter matches topic most
	// specifically, or a nil interface (never a typed nil) when no stream
	// captures topic; such topics go through mochi unchanged. Specificity:
	// matching filters are compared level by level from the left, and at
	// the first level where they differ a literal beats '+', '+' beats
	// '#', and a filter that ends with the topic beats one going on with
	// "/#" (for topic "a": "a" over "a/#"). So for "m/n/o", "m/#" wins
	// over "+/n/o". Top-level wildcards never match a topic starting with
	// '$', and the empty topic matches nothing.
	Route(topic string) Stream
	// Streams lists every stream once, in configuration order, then those
	// added while the log runs, in the order they were added.
	Streams() []Stream
	// Stream returns the named stream (the one Streams lists), or a nil
	// interface (never a typed nil) when the log has none of that name,
	// as after it is removed.
	Stream(name string) Stream
	// State is where consumer groups and durable sessions keep their
	// positions, next to the log they point into.
	State() StateStore
	// WatchStreams returns a channel of the log's stream changes and a
	// cancel that ends them. The channel first gets an Added event for
	// every stream the log has, in Streams order, then one event per
	// stream added or removed, in the order of the changes, so a watcher
	// misses none. By the time an event is received, Route and Streams
	// already answer with the change. The log never waits for a watcher:
	// events queue until read. A removed stream behaves as a closed one:
	// its appends fail with logstore.ErrClosed, its reads too, and its
	// Changed is closed. cancel (idempotent) returns once the channel is
	// closed; closing the log closes it too.
	WatchStreams() (events <-chan StreamEvent, cancel func())
}

// StreamEvent is a stream added to or removed from a Log.
type StreamEvent struct {
	Kind   logstore.StreamEventKind // logstore.StreamAdded or StreamRemoved
	Stream Stream
}

// ForwardStreamEvents turns a log's own stream events (in, ended by
// cancelIn) into StreamEvents, for an adapter that makes a log an mqtt.Log
// (edge's storeLog, mqtttest's MemLog). Its goroutine ends, and the returned
// channel closes, when in closes or cancel is called; cancel returns once
// it has.
func ForwardStreamEvents[E any](in <-chan E, cancelIn func(), conv func(E) StreamEvent) (<-chan StreamEvent, func()) {
	out := make(chan StreamEvent)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for ev := range in {
			select {
			case out <- conv(ev):
			case <-stop:
				return
			}
		}
	}()
	var once sync.Once
	return out, func() {
		once.Do(func() {
			close(stop)
			cancelIn()
			<-done
		})
	}
}

// SharedState is implemented by a Log whose streams' state several
// brokers share (the nodes of a cluster's site) while each knows only the
// durable sessions of its own clients: a session's offset in a stream's
// state whose session this broker does not know is then another
// broker's, not a leftover to delete.
type SharedState interface {
	StreamStateShared() bool
}

// SiteSessions is implemented by a Log whose durable sessions belong to a
// site of brokers (a cluster) rather than to one: a client whose broker
// died finds its session on another. Sessions are then read when their
// client connects, not at start, and are held by one broker at a time.
type SiteSessions interface {
	// SessionState keeps the sessions' properties and subscriptions, the
	// same on every broker of the site: a write reaches them all, a load
	// reads this broker's copy. Before the site serves it, writes fail
	// with ErrLeaderUnavailable and loads find nothing. The site may drop
	// the part of a write whose session's claim another broker holds
	// (SiteSessionKey), as this broker drops its own once it knows.
	SessionState() StateStore
	// ClaimSession makes this broker the holder of client id's session,
	// taking it from the broker that held it, which is told
	// (OnSessionTaken) once its copy of the site's state shows the move.
	// False when the site cannot decide it now.
	ClaimSession(id string) bool
	// ReleaseSession gives id's claim up (its session ended here), without
	// waiting.
	ReleaseSession(id string)
	// OnSessionTaken sets fn (nil: none), called with the client id of a
	// session this broker held that another broker claimed (or whose
	// claim the site no longer gives it at all). fn must not block, nor
	// claim or release.
	OnSessionTaken(fn func(id string))
	// OnSessionsOrphaned sets fn (nil: none), called on the one broker of
	// the site that is to take them over with the client ids of sessions
	// whose holder the site saw fail, leave or restart, or that no broker
	// holds, again and again until they are adopted or claimed. fn must
	// not block, nor claim.
	OnSessionsOrphaned(fn func(ids []string))
	// AdoptSession makes this broker the holder of client id's session
	// if the broker holding it is still gone (or none holds it), so that
	// it runs the session's expiry; false when not (it came back, a
	// client claimed the session, this broker is no longer the one to
	// adopt, ctx ended).
	AdoptSession(ctx context.Context, id string) bool
}

// StateStore keeps small values by key (logstore.Store's consumer state).
type StateStore interface {
	// WriteState sets puts and deletes dels in one atomic step: a reader
	// or a restart sees all of it or none. It is as durable as the log's
	// appends: when it returns nil on a log that persists, the change
	// survives a restart. A key both put and deleted in one call ends up
	// deleted. The caller may reuse the values once it returns. A call of
	// more than logstore.MaxStateWrite entries is refused and changes
	// nothing; after close every call fails with logstore.ErrClosed.
	WriteState(puts map[string][]byte, dels []string) error
	// LoadState calls fn, in key order, for every entry whose key starts
	// with prefix ("" for all). val is only valid during the call. The
	// first error from fn ends the walk and is returned, wrapped. After
	// close it fails with logstore.ErrClosed.
	LoadState(prefix string, fn func(key string, val []byte) error) error
}

// Stream is one append-only offset log. Offsets start at 0, never repeat
// and never go backwards, across restarts and retention.
type Stream interface {
	// Name is the stream's name, unique in its log.
	Name() string
	// Filters are the topic filters the stream captures, in configuration
	// order. The slice is the caller's: changing it changes no routing.
	Filters() []string

	// AppendAsync hands records to the stream's appender. done is called
	// exactly once. done(first, nil) means the records are committed:
	// they hold the offsets first, first+1, ... in recs order, Committed()
	// is already above the last of them when done runs, and Read returns
	// them. Committed means below the high watermark, which is what every
	// reader sees; on a single node the watermark follows the log end once
	// a write is durable by the stream's durability setting (fsync, or
	// written with an fsync to follow within the sync interval), and in a
	// cluster once the in-sync replicas hold it. It does not promise that
	// this node has fsynced the records.
	//
	// For one stream, done calls happen in the order of the AppendAsync
	// calls, and successful ones get increasing offsets in that order.
	// done runs on the appender's goroutine and must not block; after
	// close it runs at once on the caller's goroutine, so it must not take
	// a lock the caller holds either. That is the one exception to the
	// order: an append made after close may be told (ErrClosed) before
	// the appends still queued at close are.
	//
	// The appender sets each record's Offset and, when zero, its Timestamp
	// (unix ms, broker clock); a non-zero Timestamp is kept. The caller
	// must not touch recs until done, nor change the records after: the
	// log may keep them and hand them to readers. A refused append (a nil
	// record, a record too large, a full disk, a closed log) gets
	// done(0, err) with err wrapping the matching logstore sentinel, takes
	// no offset, and leaves the appends before and after it unaffected. An
	// empty recs succeeds with first at the log end and changes nothing.
	// Appends still queued at close fail with logstore.ErrClosed or
	// commit; either way their done is called.
	AppendAsync(recs []*logstore.Record, done func(first uint64, err error))

	// Read returns committed records starting at offset from, in offset
	// order: at least one record when FirstOffset() <= from < Committed()
	// (even one larger than maxBytes), at most max records, and no more
	// than maxBytes of Record.Size in total unless the first record alone
	// is larger; max <= 0 or maxBytes <= 0 sets no limit. It returns an
	// empty slice and no error when from == Committed(), and an error
	// wrapping logstore.ErrOffsetOutOfRange when from is below
	// FirstOffset() or above Committed(). After close it fails with
	// logstore.ErrClosed. The records returned may be shared with other
	// readers: do not modify them.
	Read(from uint64, max, maxBytes int) ([]*logstore.Record, error)

	// OffsetForTime returns the first offset at or after FirstOffset()
	// whose record has a timestamp at or after t, or Committed() when
	// every record is older.
	OffsetForTime(t time.Time) (uint64, error)

	// FirstOffset is the offset of the oldest record retention still
	// holds (0 until retention drops a record). It only grows.
	FirstOffset() uint64
	// Committed is the offset after the last committed record (the high
	// watermark): readers see offsets below it only. A reopened log starts
	// where it left off.
	Committed() uint64
	// WriteState and LoadState keep the stream's own consumer state: the
	// positions readers hold in it (group offsets, session cursors), with
	// StateStore's promises. It belongs to the stream, not the node: a
	// removed stream's state goes with it, and a cluster replicates it
	// with the stream so that the node leading the stream serves it. On a
	// closed or removed stream both fail with logstore.ErrClosed.
	StateStore
	// StateMoved returns a channel closed when the stream's state was
	// changed by something other than this node's WriteState (a cluster
	// moved the stream's leadership here, or applied the leader's state
	// on a replica): whoever caches the state must load it again. Take
	// the channel before loading. A single-node log never closes it.
	StateMoved() <-chan struct{}
	// Claim makes holder the single holder of key in this stream (a
	// consumer group's one active consumer), unless another holder has it:
	// ok is false then, and current names that holder. Claiming a key one
	// holds succeeds. Claims name connected consumers: they last until
	// Unclaim, or until the holder's node restarts (a single node
	// forgets them; a cluster keeps them with the stream across a change
	// of leader, and frees them when the holder's node fails or
	// restarts).
	Claim(key, holder string) (ok bool, current string)
	// Unclaim gives key up if holder holds it, and does nothing otherwise.
	Unclaim(key, holder string)

	// Changed returns a channel that is closed the next time Committed
	// advances, or when the stream closes (it then stays closed: Changed
	// of a closed stream never blocks). It may also close for other
	// reasons (truncation, retention, the log end moving): a reason to
	// look again, not proof of new records. Take the channel before
	// checking Committed: an advance after the channel was taken closes
	// it, so a waiter that checks and then waits misses none.
	Changed() <-chan struct{}
}
