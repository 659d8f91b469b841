package source

import (
	"context"
	"time"
)

// State is a source's health.
type State string

const (
	// StateConnecting: no connection upstream yet.
	StateConnecting State = "connecting"
	// StateConnected: connected, and whatever arrived became durable
	// within StallAfter.
	StateConnected State = "connected"
	// StateStalled: connected, with messages waiting to be durable (or a
	// lag the upstream reports) and nothing made durable for StallAfter.
	StateStalled State = "stalled"
	// StatePaused: paused through the API; not connected.
	StatePaused State = "paused"
	// StateStandby: in a site, another node leads the stream and runs the
	// source (Status.Leader names it).
	StateStandby State = "standby"
)

// States lists every State, for the peat_source_state metric.
var States = []State{StateConnecting, StateConnected, StateStalled, StatePaused, StateStandby}

// Status is a source as GET /api/v1/sources shows it.
type Status struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Upstream string `json:"upstream"`
	Stream   string `json:"stream"`
	State    State  `json:"state"`
	// Leader is, in a site, the node that leads the stream and runs the
	// source ("" while none is known, and on a single node).
	Leader string `json:"leader,omitempty"`
	// Counts since this process started, on this node.
	Received   uint64 `json:"received"`
	Appended   uint64 `json:"appended"`
	Duplicates uint64 `json:"duplicates"`
	Dropped    uint64 `json:"dropped"`
	// Pending is what was received and is not yet durable here.
	Pending      int64      `json:"pending"`
	LastReceived *time.Time `json:"last_received,omitempty"`
	LastDurable  *time.Time `json:"last_durable,omitempty"`
	// LagRecords is how far the source is behind the upstream's end,
	// where the upstream reports it (Kafka); absent otherwise.
	LagRecords  *int64     `json:"lag_records,omitempty"`
	Reconnects  uint64     `json:"reconnects"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// Status reports the source now.
func (s *Source) Status() Status {
	now := time.Now()
	st := Status{
		Name: s.cfg.Name, Kind: s.cfg.Kind, Upstream: s.cfg.Upstream.String(), Stream: s.cfg.Stream,
		Received: s.received.Load(), Appended: s.appended.Load(), Duplicates: s.duplicates.Load(),
		Dropped: s.dropped.Load(), Pending: s.pending.Load(), Reconnects: s.reconnects.Load(),
		LastReceived: unixTime(s.lastReceived.Load()), LastDurable: unixTime(s.lastDurable.Load()),
	}
	if ld := s.cfg.Leadership; ld != nil {
		var here bool
		st.Leader, _, here = ld.Leader(s.cfg.Stream)
		s.standby.Store(!here)
	}
	if l := s.lag.Load(); l != nil {
		if n, ok := (*l).Lag(); ok {
			st.LagRecords = &n
		}
	}
	s.mu.Lock()
	if s.mu.lastErr != "" {
		at := s.mu.lastErrAt
		st.LastError, st.LastErrorAt = s.mu.lastErr, &at
	}
	s.mu.Unlock()
	st.State = s.state(st, now)
	return st
}

func (s *Source) state(st Status, now time.Time) State {
	switch {
	case s.standby.Load():
		return StateStandby
	case s.paused.Load():
		return StatePaused
	case !s.connected.Load():
		return StateConnecting
	}
	waiting := time.Duration(0)
	if h := s.headSince.Load(); h != 0 {
		waiting = now.Sub(time.Unix(0, h))
	}
	lagging := st.LagRecords != nil && *st.LagRecords > 0 &&
		now.Sub(time.Unix(0, s.progressAt.Load())) > s.cfg.StallAfter
	if waiting > s.cfg.StallAfter || lagging {
		return StateStalled
	}
	return StateConnected
}

func unixTime(ns int64) *time.Time {
	if ns == 0 {
		return nil
	}
	t := time.Unix(0, ns)
	return &t
}

// monitor keeps the gauges current and logs the source's entering and
// leaving the stalled state; when Run ends, the source's series go.
func (s *Source) monitor(ctx context.Context) {
	t := time.NewTicker(min(time.Second, max(s.cfg.StallAfter/4, 10*time.Millisecond)))
	defer t.Stop()
	defer s.m.forget()
	var last State
	for {
		st := s.Status()
		s.m.set(st)
		if st.State != last {
			if st.State == StateStalled {
				s.log.Warn("source stalled: messages wait to be durable, or the upstream is ahead, and nothing became durable",
					attrWaiting, st.Pending, attrFor, s.cfg.StallAfter)
			} else if last == StateStalled {
				s.log.Info("source no longer stalled", attrState, string(st.State))
			}
			last = st.State
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
