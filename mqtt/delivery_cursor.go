package mqtt

import (
	"context"

	"github.com/peatmq/peat/logstore"
)

// A cursor feeds one consumer that fell behind the shared reader of a
// stream: a client whose queue was full, or a $share group none of whose
// members had room for a QoS 1/2 record. A client's cursor drops QoS 0
// records that are more than Config.QoS0MaxLag behind the committed end,
// when it reaches them or, while it waits for room in the queue, as the end
// moves on (counted as slow_qos0, each as it is dropped): only a QoS 0
// subscriber that stays that far behind loses messages. It reads the log from the first
// offset the consumer missed, matches each record for that consumer alone,
// and waits for room in the queue instead of dropping. When it reaches the
// reader's dispatched offset it switches back under the reader's lock, so
// the consumer gets every offset once: the cursor's records are queued
// before anything the reader offers after the switch.

// runClientCursor feeds member m of r from offset from.
func (r *deliveryReader) runClientCursor(m *deliveryMember, from uint64) {
	defer r.d.wg.Done()
	c := m.c
	placeOne := func(rec *logstore.Record) error {
		sub, ok := r.d.srv.Topics.Subscribers(rec.Topic).Subscriptions[c.id]
		if !ok {
			return nil
		}
		it, ok := r.item(c, sub, rec)
		if !ok {
			return nil
		}
		if it.qos == 0 && r.lagsTooFar(rec) {
			r.d.dropSlowQoS0.Inc()
			return nil
		}
		if m.prog != nil {
			it.done = m.prog.add(rec.Offset)
		}
		if it.qos > 0 {
			return c.push(it)
		}
		queued, err := r.pushQoS0(c, it)
		if !queued && m.prog != nil {
			m.prog.unadd()
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
		return true
	}
	r.catchUp(c.ctx, from, []any{deliveryAttrClient, c.id}, place, rejoinLocked)
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
	r.catchUp(r.d.ctx, from, []any{deliveryAttrGroup, g.key}, place, rejoinLocked)
}

// placeShared gives rec to one connected member of g, waiting for room when
// every member's queue is full.
func (r *deliveryReader) placeShared(g *deliveryGroup, rec *logstore.Record) error {
	shared := r.d.srv.Topics.Subscribers(rec.Topic).Shared[g.key]
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
			case <-r.d.ctx.Done():
				return r.d.ctx.Err()
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

// catchUp reads from offset from, handing each record to place, until it
// reaches the reader's dispatched offset; then rejoinLocked, called under
// r.mu, puts the consumer back on the shared reader. It returns early when
// ctx ends or place fails (the consumer is gone).
func (r *deliveryReader) catchUp(ctx context.Context, from uint64, who []any,
	place func(*logstore.Record) error, rejoinLocked func(next uint64) bool) {
	next := from
	for ctx.Err() == nil {
		r.mu.Lock()
		end := r.mu.dispatched
		if next >= end {
			ok := rejoinLocked(next)
			r.mu.Unlock()
			if ok {
				r.d.logger.Debug("delivery: caught up; back on the shared reader",
					append(who, deliveryAttrStream, r.stream.Name(), deliveryAttrOffset, next)...)
			}
			return
		}
		r.mu.Unlock()

		n := int(min(uint64(r.d.cfg.ReadBatch), end-next))
		recs, err := r.stream.Read(next, n, r.d.cfg.ReadBatchBytes)
		if err != nil {
			if first := r.stream.FirstOffset(); next < first {
				r.d.logger.Warn("delivery: lagging cursor fell below the log start; skipping to it",
					append(who, deliveryAttrStream, r.stream.Name(), deliveryAttrOffset, next, deliveryAttrCount, first-next)...)
				r.d.dropRetention.Add(float64(first - next))
				next = first
				continue
			}
			r.d.logger.Error("delivery: cursor read",
				append(who, deliveryAttrStream, r.stream.Name(), deliveryAttrOffset, next, deliveryAttrError, err)...)
		}
		if err != nil || len(recs) == 0 {
			if !deliverySleep(ctx, deliveryRetryDelay) {
				return
			}
			continue
		}
		for _, rec := range recs {
			if rec.Offset >= end {
				break
			}
			if err := place(rec); err != nil {
				return
			}
			next = rec.Offset + 1
		}
		yieldToLive()
	}
}
