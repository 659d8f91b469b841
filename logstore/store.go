package logstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// Store is a set of streams kept in one Badger database.
//
// Locks: Store.life (Read and Close) is taken before Store.writeMu (commits
// read-lock it, DropPrefix write-locks it); Stream.q and Stream.mu are
// leaves, never held while taking another lock.
type Store struct {
	cfg        Config
	db         *badger.DB
	log        *slog.Logger
	metrics    *Metrics
	set        atomic.Pointer[streamSet] // the streams and their router (streams_runtime.go)
	syncWrites bool
	logSync    *logSyncer // without SyncWrites: what syncs the store

	stopping chan struct{}   // closed by Close: appenders and loops stop
	ctx      context.Context // cancelled by Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// writeMu keeps commits out while DropPrefix runs: Badger would
	// refuse them with ErrBlockedWrites; waiting is better.
	writeMu sync.RWMutex

	life struct {
		sync.RWMutex
		closed bool
	}
	// changes serializes AddStream and RemoveStream, and their events to
	// the watchers (streams_runtime.go). It is taken before writeMu.
	changes struct {
		sync.Mutex
		closed bool // Close began: no more changes
	}
	watchers Watchers[StreamEvent] // Watch (streams_watch.go)

	closeOnce sync.Once
	closeErr  error

	space    spaceGuard
	overhead int64 // disk beyond the records (DiskBound)

	reclaim struct {
		sync.Mutex
		last time.Time
	}
	reclaimEvery time.Duration
	reclaimed    atomic.Bool // a DropPrefix ran since the last value-log GC

	// deleteHook, when set (tests), runs after each step of a stream's
	// deletion; an error stops it there, as a crash would (delete.go).
	deleteHook func(step string) error

	// Batch and transaction limits derived from the profile.
	batchBytes, txnBytes, txnCount int
	maxValue                       int // largest encoded record value
}

// Open opens (or creates) the store described by cfg and starts one
// appender per stream.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Profile = cfg.Profile.orDefault()
	if cfg.RetentionInterval == 0 {
		cfg.RetentionInterval = DefaultRetentionInterval
	}
	st := &Store{
		cfg:          cfg,
		log:          cfg.Logger,
		metrics:      cfg.Metrics,
		stopping:     make(chan struct{}),
		reclaimEvery: cfg.ReclaimInterval,
		syncWrites:   len(cfg.Streams) == 0,
	}
	if st.log == nil {
		st.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if st.metrics == nil {
		st.metrics = NewMetrics(nil)
	}
	if st.reclaimEvery == 0 {
		st.reclaimEvery = DefaultReclaimInterval
	}
	for _, sc := range cfg.Streams {
		if sc.durability() == DurabilityFsync {
			st.syncWrites = true
		}
	}
	spec := cfg.Profile.spec()
	if cfg.InMemory {
		spec = spec.inMemory()
	}
	if cfg.tune != nil {
		cfg.tune(&spec)
	}
	maxBatch := 15 * spec.memTableSize / 100 // Badger's own limit per transaction
	st.txnBytes = int(maxBatch * 3 / 4)
	st.txnCount = int(maxBatch/96) * 3 / 4 // 96: Badger's skiplist node size
	st.batchBytes = int(maxBatch / 2)
	// Badger refuses values above ValueLogFileSize, and in memory above the
	// value threshold, with an error that dumps the whole value: check first.
	st.maxValue = int(spec.valueLogFileSize) - 1024
	if cfg.InMemory {
		st.maxValue = int(spec.valueThreshold)
	}

	st.space.init(cfg, spec)
	st.overhead = spec.diskOverhead()

	mappedLimit := cfg.MappedLimit
	if mappedLimit == 0 {
		mappedLimit = spec.mappedLimit
	}
	var trimmer *mappedTrimmer
	if mappedLimit > 0 && mappedTrimSupported && !cfg.InMemory {
		var err error
		if trimmer, err = newMappedTrimmer(cfg.Dir, mappedLimit); err != nil {
			st.log.Warn("logstore: mapped_limit not applied", attrErr, err)
			trimmer = nil
		}
	}

	opts := spec.badgerOptions().
		WithSyncWrites(st.syncWrites).
		WithLogger(badgerLogger{st.log})
	if cfg.InMemory {
		opts = opts.WithInMemory(true)
	} else {
		opts = opts.WithDir(cfg.Dir).WithValueDir(cfg.Dir)
	}
	db, err := badger.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("logstore: open badger in %q: %w", cfg.Dir, err)
	}
	st.db = db
	if !st.syncWrites && !cfg.InMemory {
		st.logSync = newLogSyncer(cfg.Dir)
	}
	if err := st.migrateLayout(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := st.finishDeletes(); err != nil {
		_ = db.Close()
		return nil, err
	}
	streams, err := st.openStreams()
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	st.set.Store(newStreamSet(streams))
	st.ctx, st.cancel = context.WithCancel(context.Background())
	for _, s := range streams {
		st.wg.Add(1)
		go s.run()
	}
	st.wg.Add(1)
	go st.retentionLoop()
	if st.logSync != nil {
		st.wg.Add(1)
		go st.syncLoop()
	}
	if trimmer != nil {
		st.wg.Add(1)
		go st.mappedLoop(trimmer)
	}
	st.metrics.gauges.attach(st)
	return st, nil
}

// openStreams maps stream names to ids (assigning new ids in one
// transaction) and loads each stream's offsets and chunk stats. Stored
// streams the config does not list keep their id and records, unread.
func (st *Store) openStreams() ([]*Stream, error) {
	ids := map[string]uint32{}
	var maxID uint32
	err := st.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tagMeta, metaStreamID}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			name := string(item.Key()[2:])
			err := item.Value(func(v []byte) error {
				if len(v) != 4 {
					return fmt.Errorf("stream id of %q: %d bytes, want 4", name, len(v))
				}
				ids[name] = binary.BigEndian.Uint32(v)
				maxID = max(maxID, ids[name])
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("logstore: read stream ids: %w", err)
	}
	err = st.db.Update(func(txn *badger.Txn) error {
		for _, sc := range st.cfg.Streams {
			if _, ok := ids[sc.Name]; ok {
				continue
			}
			maxID++
			ids[sc.Name] = maxID
			if err := txn.Set(streamIDKey(sc.Name), binary.BigEndian.AppendUint32(nil, maxID)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("logstore: assign stream ids: %w", err)
	}
	var streams []*Stream
	for _, sc := range st.cfg.Streams {
		s := newStream(st, sc, ids[sc.Name])
		if err := s.load(); err != nil {
			return nil, fmt.Errorf("logstore: load stream %q: %w", sc.Name, err)
		}
		streams = append(streams, s)
	}
	return streams, nil
}

// view runs fn in a Badger read transaction. Badger panics on some
// damaged tables instead of returning an error; view recovers that into a
// damagedError (matching ErrCorrupt), so damage on disk is an error of the
// read that met it, not a crash of the broker.
func (st *Store) view(fn func(txn *badger.Txn) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = damagedError{r}
		}
	}()
	return st.db.View(fn)
}

// Close stops the appenders (queued appends fail with ErrClosed), stops
// retention and closes Badger. It is idempotent.
func (st *Store) Close() error {
	st.closeOnce.Do(func() {
		st.changes.Lock()
		st.changes.closed = true // no stream or watcher starts after wg.Wait begins
		st.changes.Unlock()
		close(st.stopping)
		st.watchers.Close()
		st.cancel()
		st.wg.Wait()
		st.life.Lock()
		st.life.closed = true
		st.life.Unlock()
		var errs []error
		if st.logSync != nil {
			if err := st.logSync.sync(); err != nil {
				errs = append(errs, fmt.Errorf("logstore: final sync: %w", err))
			}
		}
		if err := st.db.Close(); err != nil {
			errs = append(errs, fmt.Errorf("logstore: close badger: %w", err))
		}
		st.metrics.gauges.detach(st)
		st.closeErr = errors.Join(errs...)
	})
	return st.closeErr
}

// CommitsWaitForFsync reports whether a group commit returns only after
// fsync (some stream has fsync durability): the appender then spends most
// of each commit blocked in a system call.
func (st *Store) CommitsWaitForFsync() bool { return st.syncWrites && !st.cfg.InMemory }

// Stream returns the named stream, or nil (also once it is removed).
func (st *Store) Stream(name string) *Stream { return st.set.Load().byName[name] }

// Streams returns the streams in config order, then those added at run
// time in the order they were added.
func (st *Store) Streams() []*Stream { return append([]*Stream(nil), st.set.Load().streams...) }

// Route returns the stream capturing topic, or nil. The most specific filter
// wins (see router). It routes by the streams of one moment: never by a
// half-made change of AddStream or RemoveStream.
func (st *Store) Route(topic string) *Stream { return st.set.Load().router.route(topic) }

// MaxRecordBytes is the largest record (encoded value, about Record.Size)
// an append accepts; larger ones fail with ErrRecordTooLarge. Front-ends
// should cap their maximum packet size below it.
func (st *Store) MaxRecordBytes() int { return st.maxValue }

// Profile is the storage profile in effect.
func (st *Store) Profile() Profile { return st.cfg.Profile }

// retentionLoop applies every stream's retention each RetentionInterval and
// gives value-log space back after a reclaim.
func (st *Store) retentionLoop() {
	defer st.wg.Done()
	ctx := st.ctx
	t := time.NewTicker(st.cfg.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-st.stopping:
			return
		case now := <-t.C:
			for _, s := range st.set.Load().streams {
				if s.cfg.MaxAge == 0 && s.cfg.MaxBytes == 0 {
					continue
				}
				_, err := s.ApplyRetention(ctx, now)
				if err != nil && !errors.Is(err, ErrClosed) && ctx.Err() == nil {
					st.log.Warn("retention failed", slog.String(attrStream, s.name), slog.Any(attrErr, err))
				}
			}
			if st.reclaimed.Swap(false) {
				st.valueLogGC(ctx)
			}
		}
	}
}

// valueLogGC gives back value-log files whose garbage reached the GC
// ratio, after a DropPrefix (the discard counts that pick them come from
// it). A round rewrites one file: what is still live goes to the head of the
// log, then the file is deleted. It loops until Badger finds no such file,
// at most once per file.
func (st *Store) valueLogGC(ctx context.Context) { st.valueLogGCAt(ctx, st.gcRatio()) }

// valueLogGCAt is valueLogGC at a given ratio.
func (st *Store) valueLogGCAt(ctx context.Context, ratio float64) {
	if st.cfg.InMemory {
		return
	}
	for range st.vlogFiles() + 1 {
		if ctx.Err() != nil || st.runValueLogGC(ratio) != nil {
			return
		}
	}
}

// runValueLogGC runs one round of value-log GC with the store's writers held
// off: a rewrite starts by reading the memtable's highest version under a
// lock that Badger's writes do not take (value.go:189, db.go:444 against
// memtable.go:195), a data race that the race detector reports and that a
// 32-bit platform could read torn. A round that deletes a file retention
// emptied takes a few milliseconds per MiB.
//
// Without SyncWrites nothing syncs the copies a round writes before Badger
// deletes the file they came from (value.go:355): a power cut then would
// lose records that were durable long before. An iterator open across the
// round defers the deletion until it is closed (value.go:366, 391), which
// is after the store has synced the copies.
func (st *Store) runValueLogGC(ratio float64) error {
	st.writeMu.Lock()
	defer st.writeMu.Unlock()
	if st.logSync != nil {
		txn := st.db.NewTransaction(false)
		defer txn.Discard()
		hold := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{0xff, 0xff}})
		defer hold.Close() // after the sync below: deferred calls run last in, first out
		defer func() {
			if err := st.logSync.sync(); err != nil {
				st.log.Error("sync after value-log GC failed", slog.Any(attrErr, err))
			}
		}()
	}
	t0 := time.Now()
	err := st.db.RunValueLogGC(ratio)
	if err == nil {
		st.log.Debug("value-log GC rewrote a file", slog.Duration(attrTook, time.Since(t0)))
	}
	return err
}

// gcRatio is the share of a value-log file that must be garbage for GC to
// rewrite it. With one stream, retention drops records in the order they
// were written, so a file's garbage only grows until all of it is garbage:
// rewriting it at half only copies records that retention drops next (at
// 0.5, 28% more bytes written per record than at 0.9, 488 against 381, in a
// pi-zero store appending 8 times its 128 MiB max_bytes, 2026-12-02), and
// waiting costs at most one file of disk. Streams interleave their records in the
// same files, and a file shared with a stream kept longer may never become
// all garbage: there a file is rewritten at half, so the value log holds
// at most twice what the streams retain.
func (st *Store) gcRatio() float64 {
	if len(st.set.Load().streams) == 1 {
		return gcRatioOneStream
	}
	return gcRatioStreams
}

// GC ratios (gcRatio).
var (
	gcRatioOneStream = 0.9
	gcRatioStreams   = 0.5
)

// vlogFiles counts the value-log files in the store's directory.
func (st *Store) vlogFiles() int {
	m, _ := filepath.Glob(filepath.Join(st.cfg.Dir, "*.vlog"))
	return len(m)
}

// syncLoop fsyncs the database's logs (logSyncer) every SyncInterval when
// no stream asks for fsync durability (SyncWrites is off).
func (st *Store) syncLoop() {
	defer st.wg.Done()
	every := st.syncEvery()
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-st.stopping:
			return
		case <-t.C:
			err := st.logSync.sync()
			if err != nil && !failing {
				st.log.Error("periodic fsync failed", slog.Any(attrErr, err))
			}
			failing = err != nil
		}
	}
}

// reclaimDue reports whether a DropPrefix may run now (store-wide rate
// limit) and, if so, books it.
func (st *Store) reclaimDue(now time.Time) bool {
	st.reclaim.Lock()
	defer st.reclaim.Unlock()
	if !st.reclaim.last.IsZero() && now.Sub(st.reclaim.last) < st.reclaimEvery {
		return false
	}
	st.reclaim.last = now
	return true
}

// Log attribute keys, spelt as in mqtt, edge and cmd/peat.
const (
	attrStream = "stream"
	attrErr    = "err"
	attrDir    = "dir"
	attrTook   = "took"
	// attrPart names the part of the store a line comes from (badger);
	// the node already tags the whole store component=logstore.
	attrPart = "part"
)

// badgerLogger bridges Badger's warnings and errors into slog.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any) {
	b.l.Error(fmt.Sprintf(f, a...), slog.String(attrPart, "badger"))
}

func (b badgerLogger) Warningf(f string, a ...any) {
	b.l.Warn(fmt.Sprintf(f, a...), slog.String(attrPart, "badger"))
}
func (badgerLogger) Infof(string, ...any)  {}
func (badgerLogger) Debugf(string, ...any) {}
