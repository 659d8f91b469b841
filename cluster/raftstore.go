package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/peatmq/peat/logstore"
)

// KV is the durable key-value space the controller's Raft state lives in:
// logstore.Store's, in the node's own Badger database (one storage
// engine, no bolt). Writes are synced before they return.
type KV interface {
	KVGet(key []byte) ([]byte, error)
	KVWrite(puts []logstore.KV, dels [][]byte) error
	KVScanRange(start, end []byte, reverse bool, fn func(key, val []byte) error) error
}

var _ KV = (*logstore.Store)(nil)

// Keys of the Raft state in the key-value space (see doc.go):
//
//	log entry     'l' <index:8 BE>   -> entry value (encodeLog)
//	stable key    's' <key>          -> value
const (
	raftLogTag    = 'l'
	raftStableTag = 's'
	logValueV1    = 1
	// deleteChunk bounds the deletes of one KVWrite: far below Badger's
	// per-transaction limit in the smallest profile.
	deleteChunk = 1024
)

// RaftStore is a raft.LogStore and raft.StableStore on a KV space.
type RaftStore struct {
	kv KV

	mu struct {
		sync.Mutex         // serialises log writes; guards first and last
		first, last uint64 // 0, 0: no entries
	}
}

var (
	_ raft.LogStore    = (*RaftStore)(nil)
	_ raft.StableStore = (*RaftStore)(nil)
)

// NewRaftStore opens the Raft state kept in kv, reading where its log
// starts and ends.
func NewRaftStore(kv KV) (*RaftStore, error) {
	s := &RaftStore{kv: kv}
	first, err := s.edge(nil, nil, false)
	if err != nil {
		return nil, err
	}
	last, err := s.edge(nil, nil, true)
	if err != nil {
		return nil, err
	}
	s.mu.first, s.mu.last = first, last
	return s, nil
}

var errStop = errors.New("stop")

// edge reads the first (or, with last, the last) index stored with a key
// in [start, end), 0 when there is none; nil bounds are the log's.
func (s *RaftStore) edge(start, end []byte, last bool) (uint64, error) {
	if start == nil {
		start = []byte{raftLogTag}
	}
	if end == nil {
		end = []byte{raftLogTag + 1}
	}
	var idx uint64
	err := s.kv.KVScanRange(start, end, last, func(k, _ []byte) error {
		if len(k) != 9 {
			return fmt.Errorf("cluster: raft log key %x is not 9 bytes", k)
		}
		idx = binary.BigEndian.Uint64(k[1:])
		return errStop
	})
	if err != nil && !errors.Is(err, errStop) {
		return 0, fmt.Errorf("cluster: read raft log bounds: %w", err)
	}
	return idx, nil
}

func logKey(idx uint64) []byte {
	k := make([]byte, 9)
	k[0] = raftLogTag
	binary.BigEndian.PutUint64(k[1:], idx)
	return k
}

// FirstIndex returns the first index stored, 0 for none.
func (s *RaftStore) FirstIndex() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.first, nil
}

// LastIndex returns the last index stored, 0 for none.
func (s *RaftStore) LastIndex() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.last, nil
}

// GetLog reads entry index into l, or returns raft.ErrLogNotFound.
func (s *RaftStore) GetLog(index uint64, l *raft.Log) error {
	v, err := s.kv.KVGet(logKey(index))
	if errors.Is(err, logstore.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("cluster: get raft log %d: %w", index, err)
	}
	if err := decodeLog(v, l); err != nil {
		return fmt.Errorf("cluster: raft log %d: %w", index, err)
	}
	l.Index = index
	return nil
}

// StoreLog stores one entry.
func (s *RaftStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores entries durably, in one write when they fit in one
// Badger transaction; otherwise in several, lowest indexes first, so a
// crash leaves a prefix of them (Raft acknowledges none before it returns).
// An entry too large for a transaction on its own fails.
func (s *RaftStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	puts := make([]logstore.KV, len(logs))
	for i, l := range logs {
		puts[i] = logstore.KV{Key: logKey(l.Index), Value: encodeLog(l)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.storeLocked(logs, puts)
}

func (s *RaftStore) storeLocked(logs []*raft.Log, puts []logstore.KV) error {
	err := s.kv.KVWrite(puts, nil)
	if errors.Is(err, logstore.ErrRecordTooLarge) && len(puts) > 1 {
		h := len(puts) / 2
		if err := s.storeLocked(logs[:h], puts[:h]); err != nil {
			return err
		}
		return s.storeLocked(logs[h:], puts[h:])
	}
	if err != nil {
		return fmt.Errorf("cluster: store raft log %d (%d bytes): %w", logs[0].Index, len(puts[0].Value), err)
	}
	for _, l := range logs {
		if s.mu.first == 0 || l.Index < s.mu.first {
			s.mu.first = l.Index
		}
		if l.Index > s.mu.last {
			s.mu.last = l.Index
		}
	}
	return nil
}

// DeleteRange deletes the entries lo to hi, inclusive. Raft deletes
// either a prefix (after a snapshot) or a suffix (a conflicting tail): a
// prefix is deleted from its low end and a suffix from its high end, in
// chunks, so a crash part way leaves a contiguous log.
func (s *RaftStore) DeleteRange(lo, hi uint64) error {
	if lo > hi {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	first, last := s.mu.first, s.mu.last
	if first == 0 || hi < first || lo > last {
		return nil
	}
	suffix := lo > first && hi >= last
	middle := lo > first && hi < last // Raft never does this; kept correct
	end := []byte(nil)
	if hi < ^uint64(0) {
		end = logKey(hi + 1)
	}
	// Collect the keys, then delete: a write from inside the scan would
	// take the store's life lock twice, which a waiting Close deadlocks.
	var keys [][]byte
	err := s.kv.KVScanRange(logKey(lo), end, suffix, func(k, _ []byte) error {
		keys = append(keys, append([]byte(nil), k...))
		return nil
	})
	for len(keys) > 0 && err == nil {
		n := min(len(keys), deleteChunk)
		err = s.kv.KVWrite(nil, keys[:n])
		keys = keys[n:]
	}
	// The bounds are read back from the keys, from where the range ended
	// (seeking past the tombstones just written), even after a failure
	// part way.
	var berr error
	switch {
	case middle:
	case suffix:
		s.mu.last, berr = s.edge(logKey(first), logKey(lo), true)
	case end == nil && err == nil:
		s.mu.first, s.mu.last = 0, 0
	default:
		if s.mu.first, berr = s.edge(end, nil, false); s.mu.first == 0 {
			s.mu.last = 0
		}
	}
	if err == nil {
		err = berr
	}
	if err != nil {
		return fmt.Errorf("cluster: delete raft log %d-%d: %w", lo, hi, err)
	}
	return nil
}

// IsMonotonic is false: the log may have a gap after a snapshot restore
// (raft.MonotonicLogStore), as raft-boltdb's may.

// Set stores val under key, durably.
func (s *RaftStore) Set(key, val []byte) error {
	if err := s.kv.KVWrite([]logstore.KV{{Key: stableKey(key), Value: val}}, nil); err != nil {
		return fmt.Errorf("cluster: set raft %q: %w", key, err)
	}
	return nil
}

// Get returns key's value, or logstore.ErrNotFound, whose text is the "not
// found" raft compares errors with (api.go, raft.go).
func (s *RaftStore) Get(key []byte) ([]byte, error) {
	v, err := s.kv.KVGet(stableKey(key))
	if errors.Is(err, logstore.ErrNotFound) {
		return nil, logstore.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: get raft %q: %w", key, err)
	}
	return v, nil
}

// SetUint64 stores val under key (8 bytes, big-endian), durably.
func (s *RaftStore) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 returns key's value, or logstore.ErrNotFound.
func (s *RaftStore) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("cluster: raft %q holds %d bytes, not a uint64", key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func stableKey(k []byte) []byte { return append([]byte{raftStableTag}, k...) }

// encodeLog encodes an entry without its index (the key holds it):
//
//	version 1 | term uvarint | type byte | appended-at unix ns varint (0: zero time)
//	| data length uvarint | data | extensions length uvarint | extensions
func encodeLog(l *raft.Log) []byte {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+1+2*binary.MaxVarintLen32+len(l.Data)+len(l.Extensions))
	b = append(b, logValueV1)
	b = binary.AppendUvarint(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.AppendVarint(b, at)
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	b = append(b, l.Extensions...)
	return b
}

var errBadLogValue = errors.New("cluster: malformed raft log value")

// decodeLog decodes what encodeLog wrote, checking every length against
// the bytes left (stored bytes are not trusted).
func decodeLog(b []byte, l *raft.Log) error {
	if len(b) < 1 || b[0] != logValueV1 {
		return errBadLogValue
	}
	b = b[1:]
	term, n := binary.Uvarint(b)
	if n <= 0 || len(b) < n+1 {
		return errBadLogValue
	}
	typ := raft.LogType(b[n])
	b = b[n+1:]
	at, n := binary.Varint(b)
	if n <= 0 {
		return errBadLogValue
	}
	b = b[n:]
	data, b, ok := lenBytes(b)
	if !ok {
		return errBadLogValue
	}
	ext, b, ok := lenBytes(b)
	if !ok || len(b) != 0 {
		return errBadLogValue
	}
	*l = raft.Log{Term: term, Type: typ, Data: data, Extensions: ext}
	if at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	return nil
}

func lenBytes(b []byte) (v, rest []byte, ok bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	b = b[k:]
	if n == 0 {
		return nil, b, true
	}
	return b[:n:n], b[n:], true
}
