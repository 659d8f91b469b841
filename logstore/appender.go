package logstore

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

type reqKind uint8

const (
	reqAppend reqKind = iota
	reqTruncate
	reqRetain
	reqReplica // AppendReplica (replica.go)
	reqHW      // SetHighWatermark (watermark.go)
	reqReset   // ResetTo (watermark.go)
)

// maxBatchRecords bounds one group commit (with Store.batchBytes).
const maxBatchRecords = 4096

// request is one entry of a stream's appender queue.
type request struct {
	kind     reqKind
	recs     []*Record
	size     int // sum of Record.Size
	done     func(first uint64, err error)
	enqueued time.Time
	qos0     bool // every record is QoS 0: it may wait StreamConfig.LingerQoS0

	offset uint64    // truncate; AppendReplica: the offset of vals[0]
	now    time.Time // retention
	vals   [][]byte  // AppendReplica: raw record values
	result chan ctlResult
}

type ctlResult struct {
	n   uint64
	err error
}

func (r *request) finish(first uint64, err error) {
	if r.result != nil {
		r.result <- ctlResult{first, err}
		return
	}
	if r.done != nil {
		r.done(first, err)
	}
}

// enqueue adds r to the queue; false once the appender has stopped.
//
// It wakes the appender unless r can wait for it: a QoS 0 append behind
// others, with no earlier deadline than theirs (linger) and no full batch
// yet. The appender is then committing, and takes the queue again after,
// or lingering until an earlier deadline. Without this, each QoS 0
// publish of a quiet stream woke the appender only to wait again: about
// 6% of the broker's CPU at 5,000 msg/s.
func (s *Stream) enqueue(r *request) bool {
	s.q.Lock()
	if s.q.closed {
		s.q.Unlock()
		return false
	}
	behind := len(s.q.reqs) > 0
	s.q.reqs = append(s.q.reqs, r)
	if r.kind == reqAppend {
		s.q.recs += len(r.recs)
		s.q.size += r.size
	}
	canWait := behind && r.kind == reqAppend && r.qos0 && s.cfg.LingerQoS0 >= s.cfg.Linger &&
		s.q.recs < maxBatchRecords && s.q.size < s.st.batchBytes
	s.q.Unlock()
	if canWait {
		return true
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

// dequeue removes the next unit of work: one control request, or a group of
// consecutive append requests bounded by maxBatchRecords and batchBytes
// (the first request is always taken whole).
func (s *Stream) dequeue() (batch []*request, ctl *request) {
	s.q.Lock()
	defer s.q.Unlock()
	q := s.q.reqs
	if len(q) == 0 {
		return nil, nil
	}
	if q[0].kind != reqAppend {
		s.q.reqs = q[1:]
		return nil, q[0]
	}
	n, recs, size := 0, 0, 0
	for n < len(q) && q[n].kind == reqAppend {
		if n > 0 && (recs+len(q[n].recs) > maxBatchRecords || size+q[n].size > s.st.batchBytes) {
			break
		}
		recs += len(q[n].recs)
		size += q[n].size
		n++
	}
	batch = q[:n:n]
	s.q.reqs = q[n:]
	s.q.recs -= recs
	s.q.size -= size
	if len(s.q.reqs) == 0 {
		s.q.reqs = nil // let the backing array go
	}
	return batch, nil
}

// run is the appender goroutine: it owns every write to the stream.
func (s *Stream) run() {
	defer s.st.wg.Done()
	defer close(s.done)
	defer s.shutdown()
	for {
		select {
		case <-s.st.stopping:
			return
		case <-s.stop:
			return
		case <-s.wake:
		}
		for {
			select {
			case <-s.st.stopping:
				return
			case <-s.stop:
				return
			default:
			}
			s.linger()
			batch, ctl := s.dequeue()
			if batch == nil && ctl == nil {
				break
			}
			if ctl != nil {
				s.handleControl(ctl)
			} else {
				s.commitBatch(batch)
			}
		}
	}
}

// linger paces group commits: a queued append waits until its linger
// (StreamConfig.Linger, or LingerQoS0 for QoS 0 appends) has passed since
// the previous commit began, or since it was queued if that is earlier.
// So commits of a stream under steady load come at most one per linger,
// each shared by all that arrived meanwhile (many sensors, each publishing
// now and then, share one commit and one fsync instead of paying for one
// each), while an append that arrives after a quiet linger commits at
// once. No append waits longer than its linger. It returns at once for a
// control request, a full batch, or a stopping store.
func (s *Stream) linger() {
	if s.cfg.Linger <= 0 && s.cfg.LingerQoS0 <= 0 {
		return
	}
	for {
		wait, full := s.lingerLeft(time.Now())
		if wait <= 0 || full {
			return
		}
		if s.lingerTimer == nil {
			s.lingerTimer = time.NewTimer(wait)
		} else {
			s.lingerTimer.Reset(wait)
		}
		select {
		case <-s.st.stopping:
			return
		case <-s.stop:
			return
		case <-s.lingerTimer.C:
			return
		case <-s.wake: // more queued: due or full yet?
		}
	}
}

// lingerLeft returns how long the queued appends may still wait at now (the
// earliest of their deadlines, see linger), and whether they already fill
// a batch or wait behind a control request (full: commit now).
func (s *Stream) lingerLeft(now time.Time) (wait time.Duration, full bool) {
	s.q.Lock()
	defer s.q.Unlock()
	q := s.q.reqs
	if len(q) == 0 || q[0].kind != reqAppend {
		return 0, false
	}
	if s.q.recs >= maxBatchRecords || s.q.size >= s.st.batchBytes {
		return 0, true
	}
	wait = MaxLinger
	since := now.Sub(s.lastCommit) // huge before the first commit
	for _, r := range q {
		if r.kind != reqAppend {
			return 0, true
		}
		d := s.cfg.Linger
		if r.qos0 {
			d = s.cfg.LingerQoS0
		}
		if wait = min(wait, d-max(now.Sub(r.enqueued), since)); wait <= 0 {
			return 0, false
		}
	}
	return wait, false
}

// shutdown fails every queued request with ErrClosed (or, for a removed
// stream, ErrStreamRemoved), in order, and wakes waiters.
func (s *Stream) shutdown() {
	s.q.Lock()
	q := s.q.reqs
	s.q.reqs, s.q.closed = nil, true
	s.q.recs, s.q.size = 0, 0
	s.q.Unlock()
	for _, r := range q {
		if r.kind != reqAppend {
			r.finish(0, s.closedErr()) // the caller adds what it was doing
			continue
		}
		s.st.metrics.AppendErrors.WithLabelValues(s.name, reasonClosed).Inc()
		r.finish(0, fmt.Errorf("append to %s: %w", s.name, s.closedErr()))
	}
	if s.st.cfg.ManualCommit && !s.removed.Load() {
		s.logHWError(s.persistHW()) // the lazy write still due (watermark.go)
	}
	s.closeChanged()
}

func (s *Stream) handleControl(r *request) {
	var n uint64
	var err error
	switch r.kind {
	case reqTruncate:
		err = s.truncate(r.offset)
	case reqRetain:
		n, err = s.retain(r.now)
	case reqReplica:
		n, err = s.appendReplica(r.offset, r.vals)
	case reqHW:
		err = s.persistHW()
		if r.result == nil { // SetHighWatermark's lazy write: nobody waits for it
			s.logHWError(err)
		}
	case reqReset:
		err = s.reset(r.offset)
	}
	r.finish(n, err)
}

// pending is one encoded record waiting for its transaction.
type pending struct {
	key, val []byte // its record key and version-1 value
	ts       int64
	rec      *Record // for the tail cache
}

// commitBatch is one group commit: offsets are assigned in queue order,
// the records are written in as few Badger transactions as fit (usually
// one), each commit is durable when it returns (SyncWrites), and then the
// requests it completed are told, in order.
func (s *Stream) commitBatch(batch []*request) {
	now := time.Now()
	s.lastCommit = now // linger paces from here
	if err := s.st.space.check(now); err != nil {
		s.st.space.noted(s.st.log, err)
		err = fmt.Errorf("append to %s: %w", s.name, err)
		for _, r := range batch {
			s.st.metrics.AppendErrors.WithLabelValues(s.name, reasonNoSpace).Inc()
			r.finish(0, err)
		}
		s.retainForSpace(now)
		return
	}
	next := s.next.Load()
	ms, epoch := now.UnixMilli(), s.epoch.Load()
	if latest, ok := s.epochs.latest(); ok && epoch < latest.epoch {
		err := fmt.Errorf("append to %s in epoch %d, the log is in epoch %d: %w", s.name, epoch, latest.epoch, ErrStaleEpoch)
		for _, r := range batch {
			s.st.metrics.AppendErrors.WithLabelValues(s.name, reasonInvalid).Inc()
			r.finish(0, err)
		}
		return
	}
	if s.st.cfg.ManualCommit && s.shipRefused() {
		err := fmt.Errorf("append to %s in epoch %d: %w", s.name, epoch, ErrShippedUnwritten)
		for _, r := range batch {
			s.st.metrics.AppendErrors.WithLabelValues(s.name, reasonIO).Inc()
			r.finish(0, err)
		}
		return
	}

	// Assign offsets and encode. Keys and values go into one arena reused
	// by the next batch: Badger copies them during Commit. When the arena
	// grows, earlier slices keep pointing at the old (intact) array.
	firstIdx := make([]int, len(batch)) // request's first record in ents; -1: refused
	var refused []error                 // why, for refused requests
	ents := make([]pending, 0, 16)
	arena := s.arena[:0]
	for i, r := range batch {
		firstIdx[i] = len(ents)
		mark := len(arena)
		var bad error
		for _, rec := range r.recs {
			if rec == nil {
				bad = ErrNilRecord
				break
			}
			rec.Offset = next + uint64(len(ents))
			rec.Epoch = epoch
			if rec.Timestamp == 0 {
				rec.Timestamp = ms
			}
			k0 := len(arena)
			arena = append(arena, recordKey(s.id, rec.Offset)...)
			k1 := len(arena)
			arena = encodeRecord(arena, rec)
			v1 := len(arena)
			if v1-k1 > s.st.maxValue {
				bad = fmt.Errorf("%w: %d bytes encoded, at most %d", ErrRecordTooLarge, v1-k1, s.st.maxValue)
				break
			}
			ents = append(ents, pending{key: arena[k0:k1:k1], val: arena[k1:v1:v1], ts: rec.Timestamp, rec: rec})
		}
		if bad != nil { // refuse the whole request, take back its offsets
			if refused == nil {
				refused = make([]error, len(batch))
			}
			refused[i] = bad
			ents, arena = ents[:firstIdx[i]], arena[:mark]
			firstIdx[i] = -1
		}
	}
	s.arena = arena
	if cap(s.arena) > 16*mib {
		s.arena = nil // do not pin a huge buffer after a burst
	}
	s.st.metrics.BatchRecords.Observe(float64(len(ents)))

	shipped := s.st.cfg.ManualCommit && len(ents) > 0 // a leader's: followers take it while it is written
	if shipped {
		s.shipBegin(next, ents)
	}
	written, ri := 0, 0
	for written < len(ents) {
		var n int
		var err error
		if shipped && written == 0 && testHookShipped != nil {
			err = testHookShipped() // an error: as if the first transaction had failed
		}
		if err == nil {
			n, err = s.writeRecords(next+uint64(written), ents[written:])
		}
		written += n
		if err != nil {
			if shipped {
				s.shipEndWrite(true)
			}
			s.report(batch, firstIdx, refused, ri, written, next, s.appendError(err))
			return
		}
		ri = s.report(batch, firstIdx, refused, ri, written, next, nil)
	}
	if shipped {
		s.shipEndWrite(false)
	}
	s.report(batch, firstIdx, refused, ri, written, next, nil)
	s.retainOnCommit(now)
}

// report finishes, in order from ri, the requests whose records are all
// among the first written; with err set it fails every other one. It
// returns the first request left unfinished.
func (s *Stream) report(batch []*request, firstIdx []int, refused []error, ri, written int, next uint64, err error) int {
	for ; ri < len(batch); ri++ {
		r := batch[ri]
		switch {
		case firstIdx[ri] < 0:
			reason := reasonInvalid
			if errors.Is(refused[ri], ErrRecordTooLarge) {
				reason = reasonTooBig
			}
			s.st.metrics.AppendErrors.WithLabelValues(s.name, reason).Inc()
			r.finish(0, fmt.Errorf("append to %s: %w", s.name, refused[ri]))
		case firstIdx[ri]+len(r.recs) <= written:
			s.mAppendDur.Observe(time.Since(r.enqueued).Seconds())
			r.finish(next+uint64(firstIdx[ri]), nil)
		case err != nil:
			r.finish(0, err)
		default:
			return ri
		}
	}
	return ri
}

// batchEnd returns how many of ents, the records from offset off on, go
// into the next batch: as many as fit in limit bytes encoded, never past
// the end of off's 1024-offset chunk (so never past a DropPrefix block), and
// at least one.
func batchEnd(off uint64, ents []pending, limit int) int {
	room := int(min(uint64(len(ents)), chunkSize-off&(chunkSize-1)))
	body := framedLen(len(ents[0].val))
	m := 1
	for m < room {
		b := body + framedLen(len(ents[m].val))
		if batchLen(m+1, b) > limit {
			break
		}
		body = b
		m++
	}
	return m
}

// appendError classifies a failed commit, counts it and logs a full disk
// once per episode.
func (s *Stream) appendError(err error) error {
	reason := reasonIO
	switch {
	case isNoSpace(err):
		reason = reasonNoSpace
		err = fmt.Errorf("%w (%w)", ErrNoSpace, err)
		s.st.space.noted(s.st.log, err)
	case errors.Is(err, ErrRecordTooLarge):
		reason = reasonTooBig
	case errors.Is(err, badger.ErrDBClosed), errors.Is(err, badger.ErrBlockedWrites):
		reason = reasonClosed
		err = fmt.Errorf("%w (%w)", ErrClosed, err)
	default:
		s.st.log.Error("append failed", slog.String(attrStream, s.name), slog.Any(attrErr, err))
	}
	s.st.metrics.AppendErrors.WithLabelValues(s.name, reason).Inc()
	return fmt.Errorf("append to %s: %w", s.name, err)
}

// writeRecords writes a prefix of ents (offsets from base on) in one
// transaction, as batches (batchEnd), with the stats of the chunks it
// touches, commits it, and publishes the new log end. It returns how many
// records it wrote.
func (s *Stream) writeRecords(base uint64, ents []pending) (int, error) {
	txn := s.st.db.NewTransaction(true)
	defer txn.Discard()
	limit := s.st.batchCap()
	arena := s.batchArena[:0] // Badger reads the values during Commit: reused after
	n, entries, size := 0, 0, 0
	for n < len(ents) {
		m := batchEnd(base+uint64(n), ents[n:], limit)
		group := ents[n : n+m]
		key, val := group[m-1].key, group[0].val
		if m > 1 {
			vals := s.batchVals[:0]
			for _, e := range group {
				vals = append(vals, e.val)
			}
			s.batchVals = vals
			a0 := len(arena)
			arena = appendBatch(arena, vals)
			val = arena[a0:len(arena):len(arena)]
		}
		esz := len(key) + len(val) + 32
		if entries > 0 && (entries+8 >= s.st.txnCount || size+esz > s.st.txnBytes) {
			break
		}
		if err := txn.Set(key, val); err != nil {
			if errors.Is(err, badger.ErrTxnTooBig) {
				if entries == 0 {
					return 0, fmt.Errorf("%w: %d bytes at offset %d", ErrRecordTooLarge, len(val), base)
				}
				break
			}
			return 0, err
		}
		entries++
		size += esz
		n += m
	}
	ents = ents[:n]
	epochs := s.epochs.starts(base, func(i int) uint32 { return ents[i].rec.Epoch }, n)
	if err := setEpochs(txn, s.id, epochs); err != nil {
		return 0, err
	}

	// Chunk stats after this transaction.
	chunks := s.mu.chunks // only the appender writes it: no lock needed to read
	var touched []chunk
	var cur chunk
	if l := len(chunks); l > 0 && chunks[l-1].start == base&^(chunkSize-1) {
		cur = chunks[l-1]
	} else {
		cur = chunk{start: base &^ (chunkSize - 1)}
	}
	var added int64
	for i, e := range ents {
		if cs := (base + uint64(i)) &^ (chunkSize - 1); cs != cur.start {
			touched = append(touched, cur)
			cur = chunk{start: cs}
		}
		cur.add(e.ts, recordBytes(len(e.val)))
		added += recordBytes(len(e.val))
	}
	touched = append(touched, cur)
	for _, c := range touched {
		if err := txn.Set(chunkKey(s.id, c.start), c.encode()); err != nil {
			return 0, fmt.Errorf("write chunk stats: %w", err)
		}
	}

	s.st.writeMu.RLock()
	t0 := time.Now()
	err := txn.Commit()
	s.mCommitDur.Observe(time.Since(t0).Seconds())
	s.st.writeMu.RUnlock()
	s.batchArena = arena
	if err != nil {
		return 0, err
	}

	s.mu.Lock()
	if l := len(s.mu.chunks); l > 0 && s.mu.chunks[l-1].start == touched[0].start {
		s.mu.chunks[l-1] = touched[0]
		touched = touched[1:]
	}
	s.mu.chunks = append(s.mu.chunks, touched...)
	s.mu.Unlock()

	end := base + uint64(n)
	recs := make([]*Record, n)
	for i, e := range ents {
		recs[i] = e.rec
	}
	s.tail.add(base, recs)
	s.epochs.add(epochs)
	s.next.Store(end)
	s.bytes.Add(added)
	moved := movedEnd
	if !s.st.cfg.ManualCommit {
		s.committed.Store(end)
		moved |= movedHW
	}
	s.notify(moved)
	s.mAppended.Add(float64(n))
	s.mBytes.Add(float64(added))
	s.st.space.noted(s.st.log, nil)
	return n, nil
}
