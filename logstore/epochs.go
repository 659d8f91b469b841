package logstore

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync"

	badger "github.com/dgraph-io/badger/v4"
)

// tagEpoch keys the leader-epoch cache: 'u' <id:4> <epoch:4> -> the first
// offset written in that epoch (uint64 BE). It sorts after the records, as
// every key a commit may write does (layout.go).
const tagEpoch = 'u'

func epochKey(id uint32, epoch uint32) []byte {
	return binary.BigEndian.AppendUint32(prefix(tagEpoch, id), epoch)
}

// epochStart is one entry of the leader-epoch cache: records from start on
// (up to the next entry's start) were written by the leader of epoch.
type epochStart struct {
	epoch uint32
	start uint64
}

// epochCache is a stream's leader-epoch cache (Kafka's leader-epoch
// checkpoint, KIP-101): the first offset of each epoch, epochs and offsets
// ascending. The appender writes each entry in the Badger transaction of
// the records that start it, so it is as durable as they are; truncation
// removes the entries at or above where it cuts, in the transaction that
// deletes the last of those records, and Open drops any a crash left above
// the log end.
type epochCache struct {
	mu      sync.RWMutex
	entries []epochStart
}

// latest returns the newest entry.
func (c *epochCache) latest() (epochStart, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if len(c.entries) == 0 {
		return epochStart{}, false
	}
	return c.entries[len(c.entries)-1], true
}

// starts returns the entries that records at offsets base, base+1, ...
// with these epochs add to the cache, given its newest entry.
func (c *epochCache) starts(base uint64, epochs func(i int) uint32, n int) []epochStart {
	last, ok := c.latest()
	var out []epochStart
	for i := range n {
		if e := epochs(i); !ok || e > last.epoch {
			last, ok = epochStart{e, base + uint64(i)}, true
			out = append(out, last)
		}
	}
	return out
}

func (c *epochCache) add(es []epochStart) {
	if len(es) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = append(c.entries, es...)
}

// truncateAt drops the entries starting at or above offset and returns
// them; setEnd (lowering the log end) runs under the same lock.
func (c *epochCache) truncateAt(offset uint64, setEnd func()) []epochStart {
	c.mu.Lock()
	defer c.mu.Unlock()
	setEnd()
	i := sort.Search(len(c.entries), func(i int) bool { return c.entries[i].start >= offset })
	gone := append([]epochStart(nil), c.entries[i:]...)
	c.entries = c.entries[:i]
	return gone
}

// startAt plans the trim of the cache when the log starts at start, as
// Kafka's truncateFromStart: the entries before the last one at or below
// start go, and that one, moved, starts at start (nothing when it already
// does). Appender goroutine; trimStart applies it once it is persisted.
func (c *epochCache) startAt(start uint64) (gone, moved []epochStart) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	i := sort.Search(len(c.entries), func(i int) bool { return c.entries[i].start > start })
	if i == 0 {
		return nil, nil
	}
	gone = append([]epochStart(nil), c.entries[:i-1]...)
	if c.entries[i-1].start < start {
		moved = []epochStart{{c.entries[i-1].epoch, start}}
	}
	return gone, moved
}

func (c *epochCache) trimStart(gone int, moved []epochStart) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = c.entries[gone:]
	if len(moved) > 0 {
		c.entries[0] = moved[0]
	}
}

// reset empties the cache and returns what it held.
func (c *epochCache) reset() []epochStart {
	c.mu.Lock()
	defer c.mu.Unlock()
	gone := c.entries
	c.entries = nil
	return gone
}

// EndOffsetForEpoch answers a follower's OffsetsForLeaderEpoch question
// (KIP-101, with KIP-279's epoch in the answer): where does the log of
// leader epoch e end? It returns the largest epoch at or below e that the
// cache knows and the start offset of the first epoch above e, or the log
// end (NextOffset) when e is the latest epoch. A follower truncates to
// min(end, its own log end) when its epoch there is the one returned, and
// asks again for that epoch otherwise.
//
// As Kafka does, an e below the earliest epoch the cache knows returns e
// itself and the earliest epoch's start offset (the epochs in between may
// have been written before this cache existed), and ok is false for an e
// above the latest epoch and for an empty cache (Kafka's undefined epoch
// and offset): nothing is known there.
func (s *Stream) EndOffsetForEpoch(e uint32) (epoch uint32, end uint64, ok bool) {
	c := &s.epochs
	c.mu.RLock()
	defer c.mu.RUnlock()
	es := c.entries
	if len(es) == 0 || e > es[len(es)-1].epoch {
		return 0, 0, false
	}
	if e == es[len(es)-1].epoch {
		return e, s.NextOffset(), true
	}
	i := sort.Search(len(es), func(i int) bool { return es[i].epoch > e }) // the first epoch above e
	if i == 0 {
		return e, es[0].start, true
	}
	return es[i-1].epoch, es[i].start, true
}

// LatestEpoch returns the newest epoch in the leader-epoch cache and the
// offset it starts at; ok is false when the cache is empty.
func (s *Stream) LatestEpoch() (epoch uint32, start uint64, ok bool) {
	l, ok := s.epochs.latest()
	return l.epoch, l.start, ok
}

// loadEpochs reads the stream's leader-epoch cache (Open), deletes the
// entries a crash during a truncation left at or above the log end next,
// and returns the newest epoch.
func (s *Stream) loadEpochs(next uint64) error {
	var es, stale []epochStart
	err := s.st.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagEpoch, s.id)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			e := epochStart{epoch: binary.BigEndian.Uint32(k[len(k)-4:])}
			if err := it.Item().Value(func(v []byte) error {
				if len(v) != 8 {
					return fmt.Errorf("start of epoch %d: %d bytes, want 8", e.epoch, len(v))
				}
				e.start = binary.BigEndian.Uint64(v)
				return nil
			}); err != nil {
				return err
			}
			if e.start >= next || (len(es) > 0 && e.start < es[len(es)-1].start) {
				stale = append(stale, e)
				continue
			}
			es = append(es, e)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read leader epochs: %w", err)
	}
	if len(stale) > 0 {
		if err := s.st.db.Update(func(txn *badger.Txn) error { return deleteEpochs(txn, s.id, stale) }); err != nil {
			return fmt.Errorf("delete leader epochs above the log end: %w", err)
		}
	}
	s.epochs.entries = es
	if len(es) > 0 {
		s.epoch.Store(es[len(es)-1].epoch)
	}
	return nil
}

func setEpochs(txn *badger.Txn, id uint32, es []epochStart) error {
	for _, e := range es {
		if err := txn.Set(epochKey(id, e.epoch), binary.BigEndian.AppendUint64(nil, e.start)); err != nil {
			return fmt.Errorf("write start of epoch %d: %w", e.epoch, err)
		}
	}
	return nil
}

func deleteEpochs(txn *badger.Txn, id uint32, es []epochStart) error {
	for _, e := range es {
		if err := txn.Delete(epochKey(id, e.epoch)); err != nil {
			return fmt.Errorf("delete start of epoch %d: %w", e.epoch, err)
		}
	}
	return nil
}
