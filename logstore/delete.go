package logstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// Deleting a stream (doc.go, "Deleting a stream").
//
//	tombstone     'x' 'n' "\x00deleting/" <id, decimal>  -> uint32 id (BE)
//	incarnation   'x' 'i' <id:4>                         -> uint64 (BE)
//
// The tombstone is a stream id key under a name no configuration can
// have (validateStreamName): an older Peat sees it as a stored stream
// that nothing lists, never reads it and never reuses its id.

const (
	metaIncarnation = 'i'
	deletingPrefix  = "\x00deleting/"
)

func incarnationKey(id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{tagMeta, metaIncarnation}, id)
}

func deletingName(id uint32) string { return deletingPrefix + strconv.FormatUint(uint64(id), 10) }

// purgeBlocks bounds the 65536-offset blocks one DropPrefix of a deletion
// takes: each stops every writer of the store while it runs, and other
// streams' commits go through between them.
const purgeBlocks = 512

// StoredStream is a stream whose records the store holds but that no
// stream of the store serves: its configuration no longer lists it.
type StoredStream struct {
	Name        string `json:"name"`
	FirstOffset uint64 `json:"first_offset"`
	NextOffset  uint64 `json:"next_offset"`
	// Bytes counts the records from FirstOffset as Stream.Bytes does.
	Bytes int64 `json:"bytes"`
	// Incarnation is what SetIncarnation last recorded (0: nothing).
	Incarnation uint64 `json:"-"`
}

// Unlisted returns the streams the store holds records, state or an id of
// but does not serve (Stream returns nil for them), by name. They stay
// on disk, unread, until DeleteStream deletes them or a configuration
// lists them again.
func (st *Store) Unlisted() ([]StoredStream, error) {
	st.life.RLock()
	defer st.life.RUnlock()
	if st.life.closed {
		return nil, fmt.Errorf("logstore: unlisted streams: %w", ErrClosed)
	}
	open := st.set.Load().byName
	var out []StoredStream
	err := st.view(func(txn *badger.Txn) error {
		ids, err := storedIDs(txn)
		if err != nil {
			return err
		}
		for name, id := range ids {
			if open[name] != nil || strings.HasPrefix(name, deletingPrefix) {
				continue
			}
			ss, err := readStored(txn, name, id)
			if err != nil {
				return fmt.Errorf("stream %q: %w", name, err)
			}
			out = append(out, ss)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("logstore: unlisted streams: %w", err)
	}
	sortStored(out)
	return out, nil
}

func sortStored(ss []StoredStream) {
	for i := 1; i < len(ss); i++ {
		for j := i; j > 0 && ss[j].Name < ss[j-1].Name; j-- {
			ss[j], ss[j-1] = ss[j-1], ss[j]
		}
	}
}

// storedIDs reads every stream id key, tombstones included.
func storedIDs(txn *badger.Txn) (map[string]uint32, error) {
	ids := map[string]uint32{}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tagMeta, metaStreamID}})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		name := string(it.Item().Key()[2:])
		err := it.Item().Value(func(v []byte) error {
			if len(v) != 4 {
				return fmt.Errorf("stream id of %q: %d bytes, want 4", name, len(v))
			}
			ids[name] = binary.BigEndian.Uint32(v)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// readStored reads what Unlisted shows of stream id without loading it.
func readStored(txn *badger.Txn, name string, id uint32) (StoredStream, error) {
	ss := StoredStream{Name: name}
	var err error
	if ss.FirstOffset, err = getUint64(txn, startKey(id)); err != nil {
		return ss, fmt.Errorf("log start: %w", err)
	}
	if ss.Incarnation, err = getUint64(txn, incarnationKey(id)); err != nil {
		return ss, fmt.Errorf("incarnation: %w", err)
	}
	ss.NextOffset = ss.FirstOffset
	rp := prefix(tagRecord, id)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: rp, Reverse: true})
	it.Seek(append(append([]byte(nil), rp...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
	if it.Valid() {
		ss.NextOffset = max(ss.NextOffset, keyOffset(it.Item().Key())+1)
	}
	it.Close()
	it = txn.NewIterator(badger.IteratorOptions{Prefix: prefix(tagChunk, id)})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		cs := keyOffset(it.Item().Key())
		if cs+chunkSize <= ss.FirstOffset || cs >= ss.NextOffset {
			continue
		}
		err := it.Item().Value(func(v []byte) error {
			c, err := decodeChunk(cs, v)
			ss.Bytes += c.bytes
			return err
		})
		if err != nil {
			return ss, err
		}
	}
	return ss, nil
}

// getUint64 reads an 8-byte big-endian value; 0 when the key is absent.
func getUint64(txn *badger.Txn, key []byte) (uint64, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var n uint64
	err = item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("%d bytes, want 8", len(v))
		}
		n = binary.BigEndian.Uint64(v)
		return nil
	})
	return n, err
}

// DeleteStream deletes a stored stream that the store does not serve (one
// of Unlisted): its records, chunk stats, leader epochs, consumer state
// (group offsets, session positions), log start, watermark and id. A
// stream the store serves is refused with ErrStreamListed: a stream is
// never deleted because a configuration left it out, only by this call.
// A later stream of the same name starts empty, at offset 0.
//
// It is crash-safe: the first transaction replaces the stream's name by a
// tombstone, so from then on no stream of that name finds the old keys;
// Open finishes a deletion a crash interrupted before it loads any
// stream. Other streams' appends go on meanwhile, waiting on each
// DropPrefix (at most purgeBlocks blocks of records each) as they wait
// on a reclaim's.
func (st *Store) DeleteStream(name string) error {
	st.changes.Lock()
	defer st.changes.Unlock()
	if st.changes.closed {
		return fmt.Errorf("delete stream %q: %w", name, ErrClosed)
	}
	if st.set.Load().byName[name] != nil {
		return fmt.Errorf("delete stream %q: %w", name, ErrStreamListed)
	}
	var id uint32
	found := false
	err := st.view(func(txn *badger.Txn) error {
		item, err := txn.Get(streamIDKey(name))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if len(v) != 4 {
				return fmt.Errorf("stream id of %q: %d bytes, want 4", name, len(v))
			}
			id, found = binary.BigEndian.Uint32(v), true
			return nil
		})
	})
	switch {
	case err != nil:
		return fmt.Errorf("delete stream %q: %w", name, err)
	case !found || validateStreamName(name) != nil:
		return fmt.Errorf("delete stream %q: %w", name, ErrUnknownStream)
	}
	return st.dropStream(name, id)
}

// dropStream deletes every key of stream id, named name: first its name
// becomes a tombstone, then its keys go, then the tombstone. A crash part
// way leaves the tombstone, which Open finishes (finishDeletes).
func (st *Store) dropStream(name string, id uint32) error {
	t0 := time.Now()
	st.writeMu.RLock()
	err := st.db.Update(func(txn *badger.Txn) error {
		if err := txn.Delete(streamIDKey(name)); err != nil {
			return err
		}
		return txn.Set(streamIDKey(deletingName(id)), binary.BigEndian.AppendUint32(nil, id))
	})
	st.writeMu.RUnlock()
	if err != nil {
		return fmt.Errorf("delete stream %q: tombstone: %w", name, err)
	}
	if err := st.deleteStep("tombstone"); err != nil {
		return err
	}
	if err := st.purge(id); err != nil {
		return fmt.Errorf("delete stream %q (finished at the next start): %w", name, err)
	}
	// The stream's records share value-log files with the others' only
	// where they were written at the same time: at half garbage a file
	// is rewritten (gcRatio keeps one stream's files until 0.9).
	st.valueLogGCAt(st.ctx, gcRatioStreams)
	st.log.Info("stream deleted", slog.String(attrStream, name), slog.Duration(attrTook, time.Since(t0)))
	return nil
}

// deleteStep is where tests stop a deletion part way, as a crash would.
func (st *Store) deleteStep(step string) error {
	if st.deleteHook != nil {
		return st.deleteHook(step)
	}
	return nil
}

// purge deletes what stream id left (its name is a tombstone already)
// and then the tombstone, so an id is never reused while keys under it
// remain. The records go a few hundred blocks at a time, each block as
// one prefix, or as its 256 runs when a table of value pointers lies
// inside it: DropPrefix deletes a table that one prefix covers unread,
// and value-log GC would then never count the records it pointed to as
// garbage (reclaimPrefixes), and the disk would not come back.
func (st *Store) purge(id uint32) error {
	lo, hi, ok, err := st.keyBlocks(id)
	if err != nil {
		return err
	}
	for from := lo; ok && from <= hi; from += purgeBlocks {
		upto := min(hi+1, from+purgeBlocks)
		if err := st.dropLocked(st.purgePrefixes(id, from, upto)...); err != nil {
			return fmt.Errorf("drop records: %w", err)
		}
		if err := st.deleteStep("block"); err != nil {
			return err
		}
	}
	// Whatever is left, epochs and consumer state among it.
	err = st.dropLocked(prefix(tagRecord, id), prefix(tagChunk, id), prefix(tagEpoch, id), prefix(tagStreamState, id))
	if err != nil {
		return fmt.Errorf("drop keys: %w", err)
	}
	st.reclaimed.Store(true) // the retention loop's value-log GC gives the space back
	if err := st.deleteStep("keys"); err != nil {
		return err
	}
	st.writeMu.RLock()
	defer st.writeMu.RUnlock()
	err = st.db.Update(func(txn *badger.Txn) error {
		for _, k := range [][]byte{startKey(id), hwKey(id), incarnationKey(id), streamIDKey(deletingName(id))} {
			if err := txn.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete stream keys: %w", err)
	}
	return nil
}

// dropLocked runs DropPrefix with the store's writers held off (they wait
// instead of failing with ErrBlockedWrites).
func (st *Store) dropLocked(prefixes ...[]byte) error {
	st.writeMu.Lock()
	defer st.writeMu.Unlock()
	return st.db.DropPrefix(prefixes...)
}

// keyBlocks returns the lowest and highest block holding a record or
// chunk-stats key of stream id.
func (st *Store) keyBlocks(id uint32) (lo, hi uint64, ok bool, err error) {
	err = st.view(func(txn *badger.Txn) error {
		for _, tag := range []byte{tagRecord, tagChunk} {
			p := prefix(tag, id)
			it := txn.NewIterator(badger.IteratorOptions{Prefix: p})
			if it.Rewind(); it.Valid() {
				if b := keyOffset(it.Item().Key()) >> blockShift; !ok || b < lo {
					lo = b
				}
				ok = true
			}
			it.Close()
			it = txn.NewIterator(badger.IteratorOptions{Prefix: p, Reverse: true})
			if it.Seek(append(append([]byte(nil), p...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)); it.Valid() {
				hi = max(hi, keyOffset(it.Item().Key())>>blockShift)
			}
			it.Close()
		}
		return nil
	})
	return lo, hi, ok, err
}

// purgePrefixes are the prefixes of blocks [from, upto) of stream id: each
// block's records (its 256 runs where a table of value pointers lies in
// the block alone) and chunk stats.
func (st *Store) purgePrefixes(id uint32, from, upto uint64) [][]byte {
	split := map[uint64]bool{}
	for _, ti := range st.db.Tables() {
		if ti.Level > 0 && ti.KeyCount > 0 && uint64(ti.UncompressedSize)/uint64(ti.KeyCount) <= pointerEntryMax {
			if b, ok := soleBlockOf(id, ti); ok && b >= from && b < upto {
				split[b] = true
			}
		}
	}
	var out [][]byte
	for b := from; b < upto; b++ {
		p := blockPrefix(tagRecord, id, b)
		if split[b] {
			for i := range subBlocks {
				out = append(out, append(p[:len(p):len(p)], byte(i)))
			}
		} else {
			out = append(out, p)
		}
		out = append(out, blockPrefix(tagChunk, id, b))
	}
	return out
}

// soleBlockOf returns the block of stream id that holds every key of
// table ti, if there is one.
func soleBlockOf(id uint32, ti badger.TableInfo) (uint64, bool) {
	l, r := ti.Left, ti.Right
	if len(l) < recordKeyLen || len(r) < recordKeyLen || !bytes.HasPrefix(l, prefix(tagRecord, id)) ||
		!bytes.Equal(l[:blockKeyLen], r[:blockKeyLen]) {
		return 0, false
	}
	return keyOffset(l[:recordKeyLen]) >> blockShift, true
}

// finishDeletes completes the deletions a crash interrupted (Open, before
// any stream loads).
func (st *Store) finishDeletes() error {
	var ids []uint32
	err := st.view(func(txn *badger.Txn) error {
		all, err := storedIDs(txn)
		for name, id := range all {
			if strings.HasPrefix(name, deletingPrefix) {
				ids = append(ids, id)
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("logstore: read stream tombstones: %w", err)
	}
	for _, id := range ids {
		t0 := time.Now()
		if err := st.purge(id); err != nil {
			return fmt.Errorf("logstore: finish deleting stream id %d: %w", id, err)
		}
		st.log.Info("finished deleting a stream a stop interrupted", slog.Uint64("id", uint64(id)),
			slog.Duration(attrTook, time.Since(t0)))
	}
	return nil
}

// Incarnation is the number SetIncarnation recorded for the stream (0:
// none). A cluster records there which creation of a stream of this name
// the records belong to.
func (s *Stream) Incarnation() uint64 { return s.incarnation.Load() }

// SetIncarnation records c as the stream's incarnation, durably.
func (s *Stream) SetIncarnation(c uint64) error {
	st := s.st
	st.life.RLock()
	defer st.life.RUnlock()
	switch {
	case st.life.closed:
		return fmt.Errorf("logstore: set incarnation of %s: %w", s.name, ErrClosed)
	case s.removed.Load():
		return fmt.Errorf("logstore: set incarnation of %s: %w", s.name, errRemoved)
	}
	st.writeMu.RLock()
	defer st.writeMu.RUnlock()
	err := st.db.Update(func(txn *badger.Txn) error {
		return txn.Set(incarnationKey(s.id), binary.BigEndian.AppendUint64(nil, c))
	})
	if err != nil {
		return fmt.Errorf("logstore: set incarnation of %s: %w", s.name, err)
	}
	s.incarnation.Store(c)
	return nil
}

func (s *Stream) loadIncarnation() error {
	return s.st.view(func(txn *badger.Txn) error {
		c, err := getUint64(txn, incarnationKey(s.id))
		if err != nil {
			return fmt.Errorf("read incarnation: %w", err)
		}
		s.incarnation.Store(c)
		return nil
	})
}
