package source

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/peatmq/peat/logstore"
)

// batch is one Next's messages on their way into the log.
type batch struct {
	msgs     []Message
	recs     []*logstore.Record // what of msgs is appended
	bytes    int
	received time.Time
	done     chan struct{} // closed when the append is told
	err      error         // the append's, read after done
}

// appendError is a failed append: the connection ends, nothing after it
// is acknowledged.
type appendError struct{ err error }

func (e *appendError) Error() string  { return "append: " + e.err.Error() }
func (e *appendError) Unwrap() error  { return e.err }
func (e *appendError) Reason() string { return "append" }

// serve runs one connection: this goroutine reads batches (Next) and
// appends them in order; the acker waits for each append, in the same
// order, and calls Done; the watcher ends the connection when the source
// is paused or this node stops leading the stream. It returns why the
// connection ended, and whether anything became durable meanwhile.
//
// The appends of the connection may still be waiting when serve returns
// (a site that cannot commit; they are told in the end): told is closed
// once all are, and Run waits for it before dialling again, so the next
// connection's Resume sees every record this one appended (an MQTT QoS 2
// redelivery is then recognised, not stored twice). Shutdown does not
// wait for it.
func (s *Source) serve(ctx context.Context, conn Conn, st Stream, epoch uint64) (progressed bool, told <-chan struct{}, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if l, ok := conn.(Lagger); ok {
		s.lag.Store(&l)
	}
	s.connected.Store(true)
	s.progressAt.Store(time.Now().UnixNano())
	defer func() {
		s.connected.Store(false)
		s.lag.Store(nil)
		s.pending.Store(0)
		s.headSince.Store(0)
	}()

	queue := make(chan *batch, s.cfg.Ahead)
	var appends sync.WaitGroup // appends not yet told
	allTold := make(chan struct{})
	defer func() {
		go func() { // ends when the log tells the last append
			appends.Wait()
			close(allTold)
		}()
	}()
	var wg sync.WaitGroup
	var durable bool
	wg.Go(func() { durable = s.ack(ctx, cancel, conn, queue) })
	wg.Go(func() { s.watch(ctx, cancel, epoch) })

	for {
		msgs, err := conn.Next(ctx)
		if err != nil {
			cancel(err)
			break
		}
		b := s.prepare(msgs, st.Name())
		select {
		case queue <- b:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		s.pending.Add(int64(len(msgs)))
		if len(b.recs) == 0 {
			close(b.done)
			continue
		}
		appends.Add(1)
		st.AppendAsync(b.recs, func(_ uint64, err error) {
			b.err = err
			close(b.done)
			appends.Done()
		})
	}
	cancel(nil)
	wg.Wait()
	return durable, allTold, context.Cause(ctx)
}

// ack calls Done for each batch once its records are committed, in the
// order they were read; a failed append or Done ends the connection. It
// reports whether any batch became durable.
func (s *Source) ack(ctx context.Context, cancel context.CancelCauseFunc, conn Conn, queue <-chan *batch) (durable bool) {
	for {
		var b *batch
		select {
		case <-ctx.Done():
			return durable
		case b = <-queue:
		}
		s.headSince.Store(b.received.UnixNano())
		select {
		case <-ctx.Done():
			return durable
		case <-b.done:
		}
		if b.err != nil {
			cancel(&appendError{err: fmt.Errorf("to %s: %w", s.cfg.Stream, b.err)})
			return durable
		}
		now := time.Now()
		if len(b.recs) > 0 {
			s.m.appendLatency.Observe(now.Sub(b.received).Seconds())
			s.appended.Add(uint64(len(b.recs)))
			s.m.appended.Add(float64(len(b.recs)))
			s.m.bytes.Add(float64(b.bytes))
		}
		if err := conn.Done(b.msgs); err != nil {
			cancel(err)
			return durable
		}
		durable = true
		s.pending.Add(-int64(len(b.msgs)))
		s.headSince.Store(0)
		s.lastDurable.Store(now.UnixNano())
		s.progressAt.Store(now.UnixNano())
	}
}

// watch ends the connection when the source is paused, or when this node
// no longer leads the stream in the epoch the connection started in.
func (s *Source) watch(ctx context.Context, cancel context.CancelCauseFunc, epoch uint64) {
	for {
		var changed <-chan struct{}
		if ld := s.cfg.Leadership; ld != nil {
			changed = ld.Changed()
			if _, e, here := ld.Leader(s.cfg.Stream); !here || e != epoch {
				s.standby.Store(!here)
				cancel(errStandby)
				return
			}
		}
		if s.paused.Load() {
			cancel(errPaused)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-s.wake:
		}
	}
}

// prepare marks msgs' records with their source and origin and keeps
// those the source's stream captures; a record another stream captures
// is dropped (logged and counted) and its message acknowledged all the
// same.
func (s *Source) prepare(msgs []Message, stream string) *batch {
	now := time.Now()
	b := &batch{msgs: msgs, received: now, done: make(chan struct{})}
	s.received.Add(uint64(len(msgs)))
	s.m.received.Add(float64(len(msgs)))
	s.lastReceived.Store(now.UnixNano())
	origin := s.cfg.Upstream.Origin()
	for _, m := range msgs {
		r := m.Record
		if r == nil && m.Drop != "" {
			s.dropped.Add(1)
			s.m.dropped(m.Drop).Inc()
			continue
		}
		if r == nil {
			s.duplicates.Add(1)
			s.m.duplicates.Inc()
			continue
		}
		if r.Topic == "" {
			s.dropped.Add(1)
			s.m.dropped("invalid").Inc()
			s.log.Warn("source drops a message that maps to no valid local topic")
			continue
		}
		if got := s.cfg.Log.Route(r.Topic); got != stream {
			s.dropped.Add(1)
			s.m.dropped("uncaptured").Inc()
			s.log.Warn("source drops a message its stream does not capture", attrTopic, r.Topic, attrStream, stream, attrCaptured, got)
			continue
		}
		r.UserProperties = slices.DeleteFunc(r.UserProperties, func(p logstore.UserProperty) bool {
			return p.Key == PropSource || p.Key == PropOrigin
		})
		r.UserProperties = append(r.UserProperties,
			logstore.UserProperty{Key: PropSource, Value: s.cfg.Name},
			logstore.UserProperty{Key: PropOrigin, Value: origin})
		b.recs = append(b.recs, r)
		b.bytes += len(r.Payload)
	}
	return b
}
