package mqtt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// Retained messages of captured topics come from the committed log, not
// from the publish that one node took: a follower replica, or a node
// restarted on its log, has them too (see doc.go).
//
// Each stream has a retained follower: a goroutine that reads the stream's
// committed records in order and sets (or, with an empty payload, clears)
// mochi's retained message for each record with Retain set. It keeps a
// compact index in the log's StateStore, next to the records it points
// into: one entry per retained topic holding the offset of its latest
// retained record, and the follower's position. At start the retained set
// is rebuilt by reading just those records, then the follower goes on from
// its position.
//
// Ingest also sets a retained message as soon as its append is committed,
// so a client that got its PUBACK finds it there at once; the per-topic
// offset below keeps the two from ever going back to an older value.

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

// retainedEntry is what set a topic's retained message last.
type retainedEntry struct {
	stream  string
	offset  uint64
	cleared bool // an empty payload; kept until the follower has passed it
}

// retainedSet is the broker's view of which record set each captured
// topic's retained message; it writes mochi's retained store.
type retainedSet struct {
	srv    *mochi.Server
	st     StateStore
	logger *slog.Logger

	mu struct {
		sync.Mutex
		topics  map[string]retainedEntry
		applied map[string]uint64 // per stream: the follower has applied every record below it
	}
}

func newRetainedSet(srv *mochi.Server, st StateStore, logger *slog.Logger) *retainedSet {
	rs := &retainedSet{srv: srv, st: st, logger: logger}
	rs.mu.topics = map[string]retainedEntry{}
	rs.mu.applied = map[string]uint64{}
	return rs
}

func (rs *retainedSet) enabled() bool { return rs.srv.Options.Capabilities.RetainAvailable != 0 }

// committed is ingest's fast path: the retained publish pk was committed at
// offset in stream. It is ignored when the follower or a later record of
// the topic got there first.
func (rs *retainedSet) committed(stream string, offset uint64, pk packets.Packet) {
	if !rs.enabled() {
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if offset < rs.mu.applied[stream] {
		return
	}
	if e, ok := rs.mu.topics[pk.TopicName]; ok && e.stream == stream && e.offset > offset {
		return
	}
	rs.setLocked(stream, offset, pk)
}

// setLocked puts pk, retained from offset, into mochi's store.
func (rs *retainedSet) setLocked(stream string, offset uint64, pk packets.Packet) {
	rs.mu.topics[pk.TopicName] = retainedEntry{stream: stream, offset: offset, cleared: len(pk.Payload) == 0}
	rs.srv.Topics.RetainMessage(pk)
	atomic.StoreInt64(&rs.srv.Info.Retained, int64(rs.srv.Topics.Retained.Len()))
}

// clearLocked removes topic's retained message.
func (rs *retainedSet) clearLocked(topic string) {
	delete(rs.mu.topics, topic)
	rs.srv.Topics.RetainMessage(packets.Packet{TopicName: topic})
	atomic.StoreInt64(&rs.srv.Info.Retained, int64(rs.srv.Topics.Retained.Len()))
}

// applyLocked applies the follower's records, in offset order, up to next,
// and returns the index changes to store.
func (rs *retainedSet) applyLocked(stream string, recs []*logstore.Record, next uint64, puts map[string][]byte, dels *[]string) {
	for _, rec := range recs {
		if !rec.Retain {
			continue
		}
		key := retainedTopicKey(stream, rec.Topic)
		if e, ok := rs.mu.topics[rec.Topic]; ok && e.stream == stream && e.offset > rec.Offset {
			// Ingest set a later record of the topic already; the
			// follower will store its offset when it gets there.
			continue
		}
		if len(rec.Payload) == 0 {
			rs.clearLocked(rec.Topic)
			delete(puts, key)
			*dels = append(*dels, key)
			continue
		}
		rs.setLocked(stream, rec.Offset, retainedPacket(rec))
		puts[key] = encodeOffset(rec.Offset)
	}
	rs.mu.applied[stream] = next
	for topic, e := range rs.mu.topics { // ingest's clears the follower has now passed
		if e.cleared && e.stream == stream && e.offset < next {
			delete(rs.mu.topics, topic)
		}
	}
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
			rs.setLocked(name, off, retainedPacket(rec))
		}
	}
	rs.mu.applied[name] = pos
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

// retainedPacket is what mochi keeps for a retained record, as
// retainedCopy makes it for a publish.
func retainedPacket(rec *logstore.Record) packets.Packet {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: rec.QoS, Retain: true},
		TopicName:   rec.Topic,
		Payload:     bytes.Clone(rec.Payload), // a read record's bytes may share a larger buffer
		Origin:      rec.ClientID,
		Created:     rec.Timestamp / 1000,
		Properties: packets.Properties{
			ContentType:           rec.ContentType,
			ResponseTopic:         rec.ResponseTopic,
			CorrelationData:       bytes.Clone(rec.CorrelationData),
			MessageExpiryInterval: rec.MessageExpiry,
		},
	}
	if pk.Created == 0 {
		pk.Created = time.Now().Unix()
	}
	if rec.PayloadFormat != nil {
		pk.Properties.PayloadFormat, pk.Properties.PayloadFormatFlag = *rec.PayloadFormat, true
	}
	for _, u := range rec.UserProperties {
		pk.Properties.User = append(pk.Properties.User, packets.UserProperty{Key: u.Key, Val: u.Value})
	}
	return pk
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
