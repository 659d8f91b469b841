package mqtt

import (
	"context"
	"fmt"
	"slices"

	"github.com/peatmq/peat/logstore"
)

// deliveryCursor is a position in one stream that delivery reads from in
// bounded batches: the shared reader's, a lagging consumer's (below) and a
// tap's (delivery_tap.go). Each is owned by one goroutine.
type deliveryCursor struct {
	d     *delivery
	s     Stream
	next  uint64 // the offset of the next record to read
	who   []any  // log attributes naming the consumer; none for the shared reader
	woken bool   // the last wait ended and nothing new has been read since
}

func newDeliveryCursor(d *delivery, s Stream, from uint64, who ...any) *deliveryCursor {
	return &deliveryCursor{d: d, s: s, next: from, who: who}
}

// read returns the next batch below end, at most ReadBatch records and
// about ReadBatchBytes, and moves next past it. A position that fell below
// the log start (retention) moves to the start instead: the records lost
// are counted as out_of_retention and logged, and read returns none.
// Callers see from next whether the cursor moved.
func (k *deliveryCursor) read(end uint64) ([]*logstore.Record, error) {
	if k.next >= end {
		return nil, nil
	}
	n := int(min(uint64(k.d.cfg.ReadBatch), end-k.next))
	recs, err := k.s.Read(k.next, n, k.d.cfg.ReadBatchBytes)
	if err != nil {
		if first := k.s.FirstOffset(); k.next < first {
			k.d.logger.Warn("delivery: position fell below the log start; skipping to it",
				k.attrs(attrCount, first-k.next)...)
			k.d.dropRetention.Add(float64(first - k.next))
			k.moveTo(first)
			return nil, nil
		}
		return nil, fmt.Errorf("read %s from offset %d: %w", k.s.Name(), k.next, err)
	}
	for len(recs) > 0 && recs[len(recs)-1].Offset >= end {
		recs = recs[:len(recs)-1]
	}
	if len(recs) > 0 {
		k.moveTo(recs[len(recs)-1].Offset + 1)
	}
	return recs, nil
}

// retry logs a failed read and waits deliveryRetryDelay before the next
// one; it reports false when ctx ends.
func (k *deliveryCursor) retry(ctx context.Context, err error) bool {
	k.d.logger.Error("delivery: read failed; retrying", k.attrs(attrErr, err)...)
	return deliverySleep(ctx, deliveryRetryDelay)
}

// moveTo makes off the next offset to read.
func (k *deliveryCursor) moveTo(off uint64) { k.next, k.woken = off, false }

// attrs are the cursor's log attributes followed by more.
func (k *deliveryCursor) attrs(more ...any) []any {
	return slices.Concat(k.who, []any{attrStream, k.s.Name(), attrOffset, k.next}, more)
}

// pause comes before waiting on changed, taken before the read that found
// nothing. A wake with nothing new is normal (the watermark moved between
// taking changed and reading it, the read took the records, and changed
// was closed for them): the next wait blocks on a fresh channel. Only a
// channel closed already while nothing is committed past the cursor,
// after such a wake, is a closed stream (its Changed stays closed): then
// it waits deliveryRetryDelay, so the loop does not spin. (Pausing on
// every empty wake stalled a site's subscribers 250 ms at a time: its
// watermark moves on every follower fetch.) It reports false when ctx
// ends.
func (k *deliveryCursor) pause(ctx context.Context, changed <-chan struct{}) bool {
	select {
	case <-changed:
		if k.woken && k.s.Committed() == k.next {
			return deliverySleep(ctx, deliveryRetryDelay)
		}
	default:
	}
	return true
}

// wait waits for changed, taken before the read that found nothing; false
// when ctx ends.
func (k *deliveryCursor) wait(ctx context.Context, changed <-chan struct{}) bool {
	if !k.pause(ctx, changed) {
		return false
	}
	select {
	case <-changed:
		k.woken = true
		return true
	case <-ctx.Done():
		return false
	}
}

// A lagging consumer's cursor feeds one consumer that fell behind the
// shared reader of a stream: a client whose queue was full, or a $share
// group none of whose members had room for a QoS 1/2 record. A client's
// cursor drops QoS 0 records that are more than Config.QoS0MaxLag behind
// the committed end, when it reaches them or, while it waits for room in
// the queue, as the end moves on (counted as slow_qos0, each as it is
// dropped): only a QoS 0 subscriber that stays that far behind loses
// messages. It reads the log from the first offset the consumer missed,
// matches each record for that consumer alone, and waits for room in the
// queue instead of dropping. When it reaches the reader's dispatched
// offset it switches back under the reader's lock, so the consumer gets
// every offset once: the cursor's records are queued before anything the
// reader offers after the switch.

// runClientCursor feeds member m of r from offset from.
func (r *deliveryReader) runClientCursor(m *deliveryMember, from uint64) {
	defer r.d.wg.Done()
	c := m.c
	placeOne := func(rec *logstore.Record) error {
		sub, ok := r.d.subs.subscribers(r.stream.Name(), rec).Subscriptions[c.id]
		if !ok || c.gated.Load() && !c.passesGates(r.stream.Name(), rec) {
			return nil
		}
		it, ok := c.item(r, sub, sub.Filter, rec)
		if !ok {
			return nil
		}
		if it.qos == 0 && r.lagsTooFar(rec) {
			r.d.dropSlowQoS0.Inc()
			return nil
		}
		if m.prog != nil {
			it.settle = m.prog.track(rec.Offset)
			it.rs = m.rs
		}
		if it.qos > 0 {
			return c.push(c.ctx, it)
		}
		queued, err := r.pushQoS0(c, it)
		if !queued && m.prog != nil {
			m.prog.untrack()
		}
		return err
	}
	place := func(rec *logstore.Record) error {
		if err := placeOne(rec); err != nil {
			return err
		}
		if m.prog != nil {
			m.prog.scan(rec.Offset + 1)
		}
		return nil
	}
	rejoinLocked := func(next uint64) bool {
		if r.mu.members[c.id] != m {
			return false // disconnected meanwhile
		}
		m.live, m.start = true, next
		c.passGates(r.stream.Name(), next)
		return true
	}
	prepLocked := func() (uint64, func() error, <-chan struct{}) { return r.retainedPrepLocked(m) }
	r.catchUp(c.ctx, newDeliveryCursor(r.d, r.stream, from, attrClient, c.id), place, prepLocked, rejoinLocked)
}

// lagsTooFar reports whether rec is more than QoS0MaxLag records behind
// the stream's committed end: a QoS 0 delivery that far behind is dropped.
func (r *deliveryReader) lagsTooFar(rec *logstore.Record) bool {
	return r.stream.Committed()-rec.Offset > uint64(r.d.cfg.QoS0MaxLag)
}

// pushQoS0 queues a QoS 0 delivery for c, waiting for room while it is
// within QoS0MaxLag of the log's end; once the end moves further ahead it
// drops it, counted as slow_qos0. It reports whether it was queued.
//
// A subscriber that stops reading its socket fills its queue, so the cursor
// waits here. Waiting for room alone held the cursor on one record however
// far the log ran ahead, and counted nothing until the subscriber read
// again (a subscriber 169k records behind showed 0 drops). Watching the
// end drops each record as it falls out of the lag, when it is lost: the
// cursor then skips on to the first record within the lag and waits there.
func (r *deliveryReader) pushQoS0(c *deliveryClient, it deliveryItem) (bool, error) {
	for {
		changed := r.stream.Changed() // before Committed: no advance is missed
		if r.lagsTooFar(it.rec) {
			r.d.dropSlowQoS0.Inc()
			return false, nil
		}
		select {
		case c.queue <- it:
			return true, nil
		case <-changed:
		case <-c.ctx.Done():
			return false, c.ctx.Err()
		}
	}
}

// runGroupCursor feeds $share group g of r from offset from.
func (r *deliveryReader) runGroupCursor(g *deliveryGroup, from uint64) {
	defer r.d.wg.Done()
	place := func(rec *logstore.Record) error { return r.placeShared(g, rec) }
	rejoinLocked := func(uint64) bool {
		g.live = true
		return true
	}
	r.catchUp(r.ctx, newDeliveryCursor(r.d, r.stream, from, attrGroup, g.key), place, nil, rejoinLocked)
}

// placeShared gives rec to one connected member of g, waiting for room when
// every member's queue is full.
func (r *deliveryReader) placeShared(g *deliveryGroup, rec *logstore.Record) error {
	shared := r.d.subs.subscribers(r.stream.Name(), rec).Shared[g.key]
	if len(shared) == 0 {
		return nil
	}
	for {
		r.mu.Lock()
		cands := r.candidatesLocked(g, shared, rec)
		r.mu.Unlock()
		if len(cands) == 0 {
			return nil // no member connected: nobody to deliver to, as in mochi
		}
		placed := false
		for _, cand := range cands {
			if cand.c.offer(cand.it) {
				placed = true
				break
			}
		}
		if !placed {
			first := cands[0]
			select {
			case first.c.queue <- first.it:
				placed = true
			case <-first.c.ctx.Done(): // gone: choose again
			case <-r.ctx.Done():
				return r.ctx.Err()
			}
		}
		if placed {
			r.mu.Lock()
			g.next++
			r.mu.Unlock()
			return nil
		}
	}
}

// catchUp reads with k, handing each record to place, until it reaches
// the reader's dispatched offset; then rejoinLocked, called under r.mu,
// puts the consumer back on the shared reader. It returns early when ctx
// ends or place fails (the consumer is gone).
//
// prepLocked, when not nil, is asked under r.mu before each batch
// (delivery_retained.go): an offset to read up to before rejoining even
// when the reader is behind it, work to do first (outside the lock), and
// a channel to wait on before rejoining.
func (r *deliveryReader) catchUp(ctx context.Context, k *deliveryCursor, place func(*logstore.Record) error,
	prepLocked func() (uint64, func() error, <-chan struct{}), rejoinLocked func(next uint64) bool) {
	for ctx.Err() == nil && r.ctx.Err() == nil { // r.ctx: the stream was removed
		r.mu.Lock()
		end := r.mu.dispatched
		if prepLocked != nil {
			hold, work, wait := prepLocked()
			if work != nil {
				r.mu.Unlock()
				if work() != nil {
					return
				}
				continue
			}
			end = max(end, hold)
			if wait != nil && k.next >= end {
				r.mu.Unlock()
				select {
				case <-wait:
				case <-ctx.Done():
					return
				case <-r.ctx.Done():
					return
				}
				continue
			}
		}
		if k.next >= end {
			ok := rejoinLocked(k.next)
			r.mu.Unlock()
			if ok {
				r.d.logger.Debug("delivery: caught up; back on the shared reader", k.attrs()...)
			}
			return
		}
		r.mu.Unlock()

		from := k.next
		recs, err := k.read(end)
		if err != nil {
			if !k.retry(ctx, err) {
				return
			}
			continue
		}
		if k.next == from && !deliverySleep(ctx, deliveryRetryDelay) { // nothing yet
			return
		}
		for _, rec := range recs {
			if err := place(rec); err != nil {
				return
			}
		}
		yieldToLive()
	}
}
