package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// streamSet is the store's streams at one moment, with their router. It is
// never changed once published: AddStream and RemoveStream build a new one
// and swap it in, so Route, Stream, Streams and Reach never see a half-made
// change.
type streamSet struct {
	streams []*Stream
	byName  map[string]*Stream
	router  *router
}

func newStreamSet(streams []*Stream) *streamSet {
	set := &streamSet{streams: streams, byName: make(map[string]*Stream, len(streams))}
	for _, s := range streams {
		set.byName[s.name] = s
	}
	set.router = newRouter(streams)
	return set
}

// errRemoved is what operations on a removed stream return: it matches
// ErrStreamRemoved and, since a removed stream is closed for good, ErrClosed.
var errRemoved = fmt.Errorf("%w (%w)", ErrStreamRemoved, ErrClosed)

// closedErr is the error of an operation refused because the appender has
// stopped.
func (s *Stream) closedErr() error {
	if s.removed.Load() {
		return errRemoved
	}
	return ErrClosed
}

// syncEvery is the period of the sync loop: the shortest sync interval of
// the streams at Open. It does not change at run time (AddStream refuses a
// stream that would need it shorter).
func (st *Store) syncEvery() time.Duration {
	every := time.Duration(0)
	for _, sc := range st.cfg.Streams {
		if every == 0 || sc.syncInterval() < every {
			every = sc.syncInterval()
		}
	}
	return every
}

// AddStream adds a stream while the store runs and starts its appender.
// cfg is validated as at Open, with the streams the store has now: a name
// or a filter another stream has is an error (wrapping ErrInvalidConfig).
// Topics the new stream's filters win (Router) are routed to it from the
// moment AddStream returns; appends routed before stay where they went.
//
// Nothing records the added stream's config: Open builds the streams its
// Config lists, as before. A name the store holds records of (a stream
// Open's config no longer lists) gets its records back, as it would by
// being listed again at Open.
//
// The Badger options are fixed at Open, so a stream whose durability they
// cannot give is refused: fsync durability when no stream at Open asked for
// it, or a sync interval shorter than the sync loop's.
func (st *Store) AddStream(cfg StreamConfig) (*Stream, error) {
	st.changes.Lock()
	defer st.changes.Unlock()
	if st.changes.closed {
		return nil, fmt.Errorf("add stream %q: %w", cfg.Name, ErrClosed)
	}
	return st.addStream(cfg, 0)
}

// addStream is AddStream with st.changes held; an incarnation other than
// 0 is recorded before the stream is shown to anyone.
func (st *Store) addStream(cfg StreamConfig, incarnation uint64) (*Stream, error) {
	cur := st.set.Load()
	check := st.cfg
	check.Streams = make([]StreamConfig, 0, len(cur.streams)+1)
	for _, s := range cur.streams {
		check.Streams = append(check.Streams, s.cfg)
	}
	check.Streams = append(check.Streams, cfg)
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("add stream %q: %w", cfg.Name, err)
	}
	if !st.syncWrites {
		switch {
		case cfg.durability() == DurabilityFsync:
			return nil, fmt.Errorf("add stream %q: %w: fsync durability needs a stream with it at Open (Badger's SyncWrites is fixed there)", cfg.Name, ErrInvalidConfig)
		case cfg.syncInterval() < st.syncEvery():
			return nil, fmt.Errorf("add stream %q: %w: sync_interval %v is shorter than the store's %v, fixed at Open", cfg.Name, ErrInvalidConfig, cfg.syncInterval(), st.syncEvery())
		}
	}
	id, err := st.streamID(cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("add stream %q: %w", cfg.Name, err)
	}
	s := newStream(st, cfg, id)
	if err := s.load(); err != nil {
		return nil, fmt.Errorf("add stream %q: load: %w", cfg.Name, err)
	}
	if incarnation != 0 {
		if err := s.SetIncarnation(incarnation); err != nil {
			return nil, fmt.Errorf("add stream %q: %w", cfg.Name, err)
		}
	}
	st.wg.Add(1)
	go s.run()
	st.set.Store(newStreamSet(append(slices.Clip(cur.streams), s)))
	st.log.Info("stream added", slog.String(attrStream, s.name))
	st.publish(StreamEvent{Kind: StreamAdded, Stream: s})
	return s, nil
}

// streamID returns the id stored for name, or assigns the next free one.
func (st *Store) streamID(name string) (uint32, error) {
	var id uint32
	st.writeMu.RLock()
	defer st.writeMu.RUnlock()
	err := st.db.Update(func(txn *badger.Txn) error {
		if item, err := txn.Get(streamIDKey(name)); err == nil {
			return item.Value(func(v []byte) error {
				if len(v) != 4 {
					return fmt.Errorf("stream id of %q: %d bytes, want 4", name, len(v))
				}
				id = binary.BigEndian.Uint32(v)
				return nil
			})
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tagMeta, metaStreamID}})
		defer it.Close()
		var maxID uint32
		for it.Rewind(); it.Valid(); it.Next() {
			err := it.Item().Value(func(v []byte) error {
				if len(v) == 4 {
					maxID = max(maxID, binary.BigEndian.Uint32(v))
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		id = maxID + 1
		return txn.Set(streamIDKey(name), binary.BigEndian.AppendUint32(nil, id))
	})
	if err != nil {
		return 0, fmt.Errorf("assign stream id: %w", err)
	}
	return id, nil
}

// RemoveStream removes the named stream while the store runs: its topics
// are routed by the remaining streams' filters from then on; its appender
// stops, and the appends still queued fail with ErrStreamRemoved; every
// later call on the *Stream (Append, Read, Wait, ...) fails with
// ErrStreamRemoved (which also matches ErrClosed), and waiters wake. Then
// its records, chunk stats, epoch cache, log start, watermark and id are
// deleted (records acknowledged before removal go too).
//
// Reads that began before RemoveStream finish first; none sees a stream
// half deleted. The deletion is DeleteStream's: once it began, a stream of
// the same name starts empty; if it fails, Open finishes it. Consumer
// state the front-end keeps in the store's own state (Store.WriteState) is
// the front-end's to delete; the stream's own (Stream.WriteState) goes.
func (st *Store) RemoveStream(name string) error {
	st.changes.Lock()
	defer st.changes.Unlock()
	if st.changes.closed {
		return fmt.Errorf("remove stream %q: %w", name, ErrClosed)
	}
	_, err := st.removeStream(name)
	return err
}

// ResetStream empties a stream the store serves, for good: it is removed
// as by RemoveStream (its records and state deleted, its *Stream closed)
// and added again with the same configuration, empty from offset 0, with
// incarnation recorded (SetIncarnation). Watchers see it removed, then
// added. A cluster resets its replica of a stream that was deleted and
// created again while this node was away.
func (st *Store) ResetStream(name string, incarnation uint64) (*Stream, error) {
	st.changes.Lock()
	defer st.changes.Unlock()
	if st.changes.closed {
		return nil, fmt.Errorf("reset stream %q: %w", name, ErrClosed)
	}
	old, err := st.removeStream(name)
	if err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	return st.addStream(old.cfg, incarnation)
}

// removeStream is RemoveStream with st.changes held.
func (st *Store) removeStream(name string) (*Stream, error) {
	cur := st.set.Load()
	s := cur.byName[name]
	if s == nil {
		return nil, fmt.Errorf("remove stream %q: %w", name, ErrUnknownStream)
	}
	rest := make([]*Stream, 0, len(cur.streams)-1)
	for _, o := range cur.streams {
		if o != s {
			rest = append(rest, o)
		}
	}
	st.set.Store(newStreamSet(rest))

	// Under life's write lock: reads in progress end first, later ones see
	// removed.
	st.life.Lock()
	s.removed.Store(true)
	st.life.Unlock()
	close(s.stop)
	<-s.done // shutdown refused the queue and woke the waiters
	st.publish(StreamEvent{Kind: StreamRemoved, Stream: s})

	st.metrics.forgetStream(name)
	if err := st.dropStream(name, s.id); err != nil {
		return s, fmt.Errorf("remove stream %q: %w", name, err)
	}
	return s, nil
}
