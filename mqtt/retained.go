package mqtt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	mochi "github.com/mochi-mqtt/server/v2"

	"github.com/peatmq/peat/logstore"
)

// Retained messages of captured topics come from the committed log, not
// from the publish that one node took: a follower replica, or a node
// restarted on its log, has them too (see doc.go).
//
// Each stream has a retained follower: a goroutine that reads the stream's
// committed records in order and sets (or, with an empty payload, clears)
// the retained message of each record's topic with Retain set. It keeps a
// compact index in the log's StateStore, next to the records it points
// into: one entry per retained topic holding the offset of its latest
// retained record, and the follower's position. At start the retained set
// is rebuilt by reading just those records, then the follower goes on from
// its position.
//
// The set is Peat's, not mochi's: mochi would send a subscriber what its
// store holds at the moment it looks (after the SUBACK), which has no
// relation to where that subscriber's live delivery from the log starts,
// so a retained record committed in between went out twice, and one the
// follower had not applied yet not at all. Instead a new subscription asks
// for a snapshot at an offset (snapshot): the follower hands it over when
// it has applied exactly the records below that offset, and the
// subscriber's live delivery of that stream starts there
// (delivery_retained.go). mochi's store keeps only topics no stream
// captures.

// retainedBatch bounds the records the follower reads at once; with its
// position it stays below logstore.MaxStateWrite entries per write.
const retainedBatch = 256

// State keys: retainedTopicKey holds a topic's offset, retainedPosKey the
// follower's position (both 8 bytes, big endian). U+0000 separates stream
// and topic: a topic never holds it.
func retainedTopicPrefix(stream string) string { return "r/" + stream + "\x00" }
func retainedTopicKey(stream, topic string) string {
	return retainedTopicPrefix(stream) + topic
}
func retainedPosKey(stream string) string { return "rp/" + stream }

// retainedEntry is the record that set a topic's retained message.
type retainedEntry struct {
	stream string
	offset uint64
	rec    *logstore.Record // a copy of its own: never modified
}

// retainedSnapshot is the retained messages of one stream matching one
// filter, as they stood below offset at: what a new subscription to filter
// gets before its live records, which start at at.
type retainedSnapshot struct {
	stream, filter string
	at             uint64
	ready          chan struct{}      // closed once recs is set
	recs           []*logstore.Record // in no particular order (one per topic)
}

// retainedSet is the broker's view of which record set each captured
// topic's retained message.
type retainedSet struct {
	srv    *mochi.Server
	st     StateStore
	logger *slog.Logger

	mu struct {
		sync.Mutex
		topics  map[string]retainedEntry
		index   logstore.TopicSet // the topics of topics, to match filters
		applied map[string]uint64 // per stream: the follower has applied every record below it
		waiting map[string][]*retainedSnapshot
	}
}

func newRetainedSet(srv *mochi.Server, st StateStore, logger *slog.Logger) *retainedSet {
	rs := &retainedSet{srv: srv, st: st, logger: logger}
	rs.mu.topics = map[string]retainedEntry{}
	rs.mu.applied = map[string]uint64{}
	rs.mu.waiting = map[string][]*retainedSnapshot{}
	return rs
}

func (rs *retainedSet) enabled() bool { return rs.srv.Options.Capabilities.RetainAvailable != 0 }

// snapshot asks for the retained messages of s matching filter below its
// committed offset, which it returns in at. The caller holds the lock of
// s's reader, so that no record at or above at can reach the subscriber
// before it decides what to do with them.
func (rs *retainedSet) snapshot(s Stream, filter string) *retainedSnapshot {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	name := s.Name()
	snap := &retainedSnapshot{stream: name, filter: filter, at: s.Committed(), ready: make(chan struct{})}
	// The follower read what it applied while at most at was committed;
	// only a truncation puts it above.
	if applied, ok := rs.mu.applied[name]; ok && applied >= snap.at {
		rs.serveLocked(snap)
		return snap
	}
	rs.mu.waiting[name] = append(rs.mu.waiting[name], snap)
	return snap
}

// serveLocked fills snap from the set as it stands and hands it over.
func (rs *retainedSet) serveLocked(snap *retainedSnapshot) {
	rs.mu.index.Match(snap.filter, func(topic string) {
		if e, ok := rs.mu.topics[topic]; ok && e.stream == snap.stream {
			snap.recs = append(snap.recs, e.rec)
		}
	})
	close(snap.ready)
}

// serveBelowLocked hands over the snapshots of stream taken at or below
// off: the set holds exactly the records below off that they want.
func (rs *retainedSet) serveBelowLocked(stream string, off uint64) {
	waiting := rs.mu.waiting[stream]
	if len(waiting) == 0 {
		return
	}
	kept := waiting[:0]
	for _, snap := range waiting {
		if snap.at <= off {
			rs.serveLocked(snap)
		} else {
			kept = append(kept, snap)
		}
	}
	clear(waiting[len(kept):])
	if len(kept) == 0 {
		delete(rs.mu.waiting, stream)
		return
	}
	rs.mu.waiting[stream] = kept
}

// setLocked makes rec, of stream, its topic's retained message.
func (rs *retainedSet) setLocked(stream string, rec *logstore.Record) {
	rs.mu.topics[rec.Topic] = retainedEntry{stream: stream, offset: rec.Offset, rec: retainedCopy(rec)}
	rs.mu.index.Add(rec.Topic)
	rs.countLocked()
}

// clearLocked removes topic's retained message.
func (rs *retainedSet) clearLocked(topic string) {
	delete(rs.mu.topics, topic)
	rs.mu.index.Remove(topic)
	rs.countLocked()
}

// countLocked keeps mochi's $SYS retained count at both stores' sum (mochi
// sets it to its own alone when it retains an uncaptured topic).
func (rs *retainedSet) countLocked() {
	atomic.StoreInt64(&rs.srv.Info.Retained, int64(len(rs.mu.topics)+rs.srv.Topics.Retained.Len()))
}

// applyLocked applies the follower's records, in offset order, up to next,
// and returns the index changes to store. A snapshot is handed over just
// before the first record at or above its offset.
func (rs *retainedSet) applyLocked(stream string, recs []*logstore.Record, next uint64, puts map[string][]byte, dels *[]string) {
	for _, rec := range recs {
		rs.serveBelowLocked(stream, rec.Offset)
		if !rec.Retain {
			continue
		}
		key := retainedTopicKey(stream, rec.Topic)
		if len(rec.Payload) == 0 {
			rs.clearLocked(rec.Topic)
			delete(puts, key)
			*dels = append(*dels, key)
			continue
		}
		rs.setLocked(stream, rec)
		puts[key] = encodeOffset(rec.Offset)
	}
	rs.advanceLocked(stream, next)
}

// advanceLocked records that the follower of stream has applied everything
// below next, and hands over the snapshots that waited for it.
func (rs *retainedSet) advanceLocked(stream string, next uint64) {
	rs.mu.applied[stream] = next
	rs.serveBelowLocked(stream, next)
}

// dropLocked clears the retained messages of stream set by records outside
// [first, end): removed by retention or truncated. It returns their keys.
func (rs *retainedSet) dropLocked(stream string, first, end uint64) []string {
	var dels []string
	for topic, e := range rs.mu.topics {
		if e.stream == stream && (e.offset < first || e.offset >= end) {
			rs.clearLocked(topic)
			dels = append(dels, retainedTopicKey(stream, topic))
		}
	}
	return dels
}

// rebuild sets the retained messages of s from its index, and returns the
// position the follower goes on from. Entries whose record retention
// removed, or that no longer hold a retained record, are deleted.
func (rs *retainedSet) rebuild(s Stream) (uint64, error) {
	name := s.Name()
	pos := s.FirstOffset()
	if err := rs.st.LoadState(retainedPosKey(name), func(key string, val []byte) error {
		if key == retainedPosKey(name) && len(val) == 8 {
			pos = max(pos, binary.BigEndian.Uint64(val))
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("load retained position of stream %s: %w", name, err)
	}
	pos = min(pos, s.Committed())
	index := map[string]uint64{}
	prefix := retainedTopicPrefix(name)
	if err := rs.st.LoadState(prefix, func(key string, val []byte) error {
		if len(val) == 8 {
			index[strings.TrimPrefix(key, prefix)] = binary.BigEndian.Uint64(val)
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("load retained index of stream %s: %w", name, err)
	}
	var dels []string
	rs.mu.Lock()
	for topic, off := range index {
		rec, err := readOne(s, off, pos)
		if err != nil {
			rs.mu.Unlock()
			return 0, fmt.Errorf("read retained record %d of stream %s: %w", off, name, err)
		}
		if rec == nil || rec.Topic != topic || !rec.Retain || len(rec.Payload) == 0 {
			dels = append(dels, prefix+topic)
			continue
		}
		if rs.enabled() {
			rs.setLocked(name, rec)
		}
	}
	rs.advanceLocked(name, pos)
	rs.mu.Unlock()
	if err := writeStateChunks(rs.st, nil, dels, "", nil); err != nil {
		return 0, fmt.Errorf("drop stale retained index entries of stream %s: %w", name, err)
	}
	return pos, nil
}

// readOne returns the record at off, or nil when retention removed it or it
// lies at or above end.
func readOne(s Stream, off, end uint64) (*logstore.Record, error) {
	if off < s.FirstOffset() || off >= end {
		return nil, nil
	}
	recs, err := s.Read(off, 1, 0)
	switch {
	case errors.Is(err, logstore.ErrOffsetOutOfRange):
		return nil, nil
	case err != nil:
		return nil, err
	case len(recs) == 0 || recs[0].Offset != off:
		return nil, nil
	}
	return recs[0], nil
}

// writeStateChunks writes puts and dels in as many steps as
// logstore.MaxStateWrite requires, and lastKey (when not "") set to lastVal
// in the last step: a reader that sees lastKey sees all the rest.
func writeStateChunks(st StateStore, puts map[string][]byte, dels []string, lastKey string, lastVal []byte) error {
	const chunk = logstore.MaxStateWrite / 2
	batch := map[string][]byte{}
	for k, v := range puts {
		batch[k] = v
		if len(batch) == chunk {
			if err := st.WriteState(batch, nil); err != nil {
				return err
			}
			batch = map[string][]byte{}
		}
	}
	for len(dels) > chunk {
		if err := st.WriteState(nil, dels[:chunk]); err != nil {
			return err
		}
		dels = dels[chunk:]
	}
	if lastKey != "" {
		batch[lastKey] = lastVal
	}
	if len(batch) == 0 && len(dels) == 0 {
		return nil
	}
	return st.WriteState(batch, dels)
}

// retainedCopy is rec for the retained set: a read record's bytes may
// share a larger buffer, which the set would otherwise keep alive.
func retainedCopy(rec *logstore.Record) *logstore.Record {
	out := *rec
	out.Payload = bytes.Clone(rec.Payload)
	out.CorrelationData = bytes.Clone(rec.CorrelationData)
	out.UserProperties = slices.Clone(rec.UserProperties)
	return &out
}

// start rebuilds the retained messages of s and starts its follower, owned
// by d, until ctx ends (the stream's reader's: removal or the delivery's
// end); the channel returned is closed once it has stopped. The rebuild
// reads only the indexed records, so it is done before the broker serves:
// a subscriber right after a restart finds them.
func (rs *retainedSet) start(ctx context.Context, d *delivery, s Stream) <-chan struct{} {
	pos, err := rs.rebuild(s)
	if err != nil {
		rs.logger.Error("retained: rebuild failed; reading the stream from its start",
			attrStream, s.Name(), attrErr, err)
		pos = s.FirstOffset()
	}
	done := make(chan struct{})
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(done)
		rs.run(ctx, s, pos)
	}()
	return done
}

// forget clears the retained messages of a removed stream from mochi and
// deletes its index; its follower must have stopped. A topic another
// stream captures now gets its next retained message from that stream.
func (rs *retainedSet) forget(stream string) {
	rs.mu.Lock()
	for topic, e := range rs.mu.topics {
		if e.stream == stream {
			rs.clearLocked(topic)
		}
	}
	delete(rs.mu.applied, stream)
	delete(rs.mu.waiting, stream) // their subscribers' reader has stopped too
	rs.mu.Unlock()
	dels := []string{retainedPosKey(stream)}
	err := rs.st.LoadState(retainedTopicPrefix(stream), func(k string, _ []byte) error {
		dels = append(dels, k)
		return nil
	})
	if err == nil {
		err = writeStateChunks(rs.st, nil, dels, "", nil)
	}
	if err != nil {
		rs.logger.Warn("retained: removed stream's index not deleted", attrStream, stream, attrErr, err)
	}
}
