package mqtt

import (
	"time"

	"github.com/peatmq/peat/logstore"
)

// Log is the offset log as the MQTT front-end sees it. On a single node the
// logstore satisfies it; in a cluster the cluster package will. mqtt never
// imports cluster: it only needs these few operations.
type Log interface {
	// Route returns the stream that captures topic, or nil when no stream
	// does; such topics go through mochi unchanged.
	Route(topic string) Stream
	// Streams lists every stream.
	Streams() []Stream
	// State is where consumer groups and durable sessions keep their
	// positions, next to the log they point into.
	State() StateStore
}

// StateStore keeps small values by key (logstore.Store's consumer state).
type StateStore interface {
	// WriteState sets puts and deletes dels, atomically and as durably as
	// the log's appends.
	WriteState(puts map[string][]byte, dels []string) error
	// LoadState calls fn for every entry whose key starts with prefix.
	LoadState(prefix string, fn func(key string, val []byte) error) error
}

// Stream is one append-only offset log.
type Stream interface {
	Name() string
	// Filters are the topic filters the stream captures.
	Filters() []string

	// AppendAsync hands records to the stream's appender. done is called
	// exactly once, on the appender's goroutine, when the records are
	// durable by the stream's durability setting (first is the offset of
	// recs[0]) or when they failed; done must not block. For one stream,
	// done calls happen in the order of the AppendAsync calls.
	AppendAsync(recs []*logstore.Record, done func(first uint64, err error))

	// Read returns committed records starting at offset from: at least one
	// record when from < Committed(), at most max records, and no more than
	// maxBytes in total unless the first record alone is larger. It returns
	// an empty slice when from == Committed(), and an error wrapping
	// logstore.ErrOffsetOutOfRange when from is below FirstOffset() or
	// above Committed().
	Read(from uint64, max, maxBytes int) ([]*logstore.Record, error)

	// OffsetForTime returns the first offset whose record has a timestamp
	// at or after t, or Committed() when every record is older.
	OffsetForTime(t time.Time) (uint64, error)

	// FirstOffset is the offset of the oldest record retention still holds.
	FirstOffset() uint64
	// Committed is the offset after the last committed record (the high
	// watermark): readers see offsets below it only.
	Committed() uint64
	// Changed returns a channel that is closed the next time Committed
	// advances, the log is truncated, or the stream closes. Take the channel
	// before checking Committed, so no advance is missed.
	Changed() <-chan struct{}
}
