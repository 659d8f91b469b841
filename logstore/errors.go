package logstore

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap them, so test with
// errors.Is.
var (
	// ErrClosed is returned by operations on a closed Store, and given to
	// appends that were still queued when it closed.
	ErrClosed = errors.New("logstore: closed")
	// ErrOffsetOutOfRange is returned by Read for an offset below
	// FirstOffset or above Committed (ReadRaw: NextOffset), by Truncate
	// below FirstOffset, and by ResetTo below NextOffset.
	ErrOffsetOutOfRange = errors.New("logstore: offset out of range")
	// ErrNoSpace is returned by appends refused because the disk is full
	// (or below the configured free-space reserve). Nothing stored is
	// damaged; appends work again once space returns.
	ErrNoSpace = errors.New("logstore: no space left on device")
	// ErrUnknownStream is returned for a stream name the store does not know.
	ErrUnknownStream = errors.New("logstore: unknown stream")
	// ErrStreamRemoved is returned by operations on a stream that
	// Store.RemoveStream removed; such errors also match ErrClosed.
	ErrStreamRemoved = errors.New("logstore: stream removed")
	// ErrStreamListed is returned by Store.DeleteStream for a stream the
	// store serves (its configuration lists it).
	ErrStreamListed = errors.New("logstore: stream is listed in the configuration")
	// ErrInvalidConfig is wrapped by Config.Validate's error.
	ErrInvalidConfig = errors.New("logstore: invalid config")
	// ErrRecordTooLarge is returned for a record that cannot fit in one
	// Badger transaction.
	ErrRecordTooLarge = errors.New("logstore: record too large")
	// ErrNotAtLogEnd is returned by AppendReplica when the first value's
	// offset is not NextOffset: the replica must truncate, or fetch from
	// its log end.
	ErrNotAtLogEnd = errors.New("logstore: replica append not at the log end")
	// ErrStaleEpoch is returned by appends whose leader epoch is below the
	// newest in the stream's leader-epoch cache (LatestEpoch): a deposed
	// leader still appending, or a follower that did not truncate.
	ErrStaleEpoch = errors.New("logstore: leader epoch below the latest")
	// ErrBelowHighWatermark is returned by Truncate, with ManualCommit, for
	// an offset below Committed: committed records are never taken back.
	ErrBelowHighWatermark = errors.New("logstore: truncation below the high watermark")
	// ErrCorrupt is wrapped by every CorruptError.
	ErrCorrupt = errors.New("logstore: corrupt record")
)

// CorruptError reports a stored record that fails its checksum or cannot be
// decoded (or is missing where the log says it must be).
type CorruptError struct {
	Stream string
	Offset uint64
	Err    error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("logstore: corrupt record in stream %q at offset %d: %v", e.Stream, e.Offset, e.Err)
}

// Unwrap lets errors.Is match both ErrCorrupt and the underlying cause.
func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

// ErrNotFound is returned, unwrapped, by KVGet for a missing key. Its
// message is exactly "not found", without the package's prefix, because
// hashicorp/raft tells a missing key in its stable store by comparing
// err.Error() == "not found" (api.go, raft.go): a Raft adapter can return
// it as it is. Test with errors.Is.
var ErrNotFound = errors.New("not found")

// ErrNilRecord is returned for an append that contains a nil *Record.
var ErrNilRecord = errors.New("logstore: nil record")

// damagedError is what Store.view returns when Badger panicked reading: it
// does on some damaged tables (slice bounds in a block's trailer,
// table/iterator.go). It matches ErrCorrupt.
type damagedError struct{ panicked any }

func (e damagedError) Error() string {
	return fmt.Sprintf("badger failed reading a damaged table: %v", e.panicked)
}

func (e damagedError) Is(target error) bool { return target == ErrCorrupt }
