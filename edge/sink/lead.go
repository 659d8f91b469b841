package sink

import (
	"context"
	"errors"
	"time"
)

// Leadership says which node of a site sends each stream: the stream's
// leader, the only node whose log is the site's (a follower's may still
// be truncated) and whose consumer-state writes land first. A sink with a
// Leadership sends a stream only while this node leads it, takes it up
// from the position the site replicated when it becomes the leader, and
// drops what it had in flight when it stops leading. Without one (a
// single node) every stream is sent here.
type Leadership interface {
	// Leader names the node that leads stream ("" while none is known),
	// the leader epoch it leads in, and whether this node runs that
	// leadership now.
	Leader(stream string) (leader string, epoch uint64, here bool)
	// Changed is closed when a leader may have changed; take it before
	// asking Leader.
	Changed() <-chan struct{}
}

// Holder is a Leadership that may ask a leader's sink to hold: send
// nothing new while Hold is true, keeping its streams, its connection and
// what it has in flight (in a site, a leader cut off from the controller,
// which may have been deposed without knowing it). The pump asks before
// every read and again at every Changed.
type Holder interface {
	Hold() bool
}

// holding reports whether the Leadership asks the sink to hold.
func (s *Sink) holding() bool {
	h, ok := s.cfg.Leadership.(Holder)
	return ok && h.Hold()
}

// errStandby ends a connection whose node leads none of the sink's
// streams any more: not a failure, the sink waits to lead one again.
var errStandby = errors.New("this node sends none of the sink's streams")

// lead takes each stream up or down as this node gains or loses its
// leadership (or the leadership's epoch changed: it may have moved away
// and back meanwhile), and reports whether any stream is led here.
func (s *Sink) lead(ctx context.Context, p *pumpState) (any bool, err error) {
	for _, c := range p.cursors {
		leader, epoch, here := s.leaderOf(c)
		switch {
		case c.closed:
		case here && (!c.led || epoch != c.ledEpoch):
			if c.led {
				s.release(p, c, leader)
			}
			if err := s.take(ctx, p, c, epoch); err != nil {
				return false, err
			}
		case !here && c.led:
			s.release(p, c, leader)
		}
		any = any || c.led
	}
	return any, nil
}

// leaderOf asks the Leadership about c's stream; without one every stream
// is led here.
func (s *Sink) leaderOf(c *cursor) (leader string, epoch uint64, here bool) {
	if s.cfg.Leadership == nil {
		return "", 0, true
	}
	return s.cfg.Leadership.Leader(c.name)
}

// take starts sending c from the position the site holds now: the last
// one any node committed, which the new leader's replica has (the
// position travels with the stream's replicated state). An upstream that
// is its own checkpoint (Resumer) may move it further.
func (s *Sink) take(ctx context.Context, p *pumpState, c *cursor, epoch uint64) error {
	if err := s.open(c); err != nil {
		return &stageError{reason: "commit", err: err}
	}
	c.moveTo(c.position.Load())
	c.slots = c.slots[:0]
	c.led, c.ledEpoch = true, epoch
	c.progressAt.Store(time.Now().UnixNano())
	s.watchBase(c)
	if r, ok := p.conn.(Resumer); ok {
		if err := s.resume(ctx, r, []*cursor{c}); err != nil {
			return err
		}
	}
	if s.cfg.Leadership != nil {
		s.log.Info("sink sends the stream: this node leads it", attrStream, c.name, attrOffset, c.position.Load(),
			attrEpoch, epoch)
	}
	return nil
}

// release stops sending c: what is in flight is forgotten (its late
// acknowledgements are ignored) and nothing more is committed for it
// here; the new leader goes on from the replicated position, so at most
// the window is sent twice.
func (s *Sink) release(p *pumpState, c *cursor, leader string) {
	for _, sl := range c.slots {
		delete(p.inflight, sl.id)
	}
	c.slots = c.slots[:0]
	c.moveTo(c.position.Load()) // what was read ahead may be read again elsewhere: drop it
	c.led = false
	// The new leader's acknowledgements are newer: this node's last one
	// would show as the stream's (peat_sink_last_success_timestamp_seconds)
	// if it led the stream again.
	c.lastSuccess.Store(0)
	s.log.Info("sink stops sending the stream: another node leads it", attrStream, c.name, attrLeader, leader,
		attrOffset, c.position.Load())
}

// waitLead returns once this node leads one of the sink's streams
// (without a Leadership: once the sink has a stream, which a sink naming
// streams lacks after they were all removed), or false when ctx ends
// first: a node that leads none holds no connection upstream.
func (s *Sink) waitLead(ctx context.Context) bool {
	for {
		var changed <-chan struct{} // nil (never ready) on a single node
		if ld := s.cfg.Leadership; ld != nil {
			changed = ld.Changed()
		}
		for _, c := range s.cursors() {
			if _, _, here := s.leaderOf(c); here {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-s.streamsWake:
		}
	}
}
