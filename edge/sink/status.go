package sink

import (
	"context"
	"slices"
	"time"
)

// State is a sink's health, judged from acknowledged progress, not from
// the socket.
type State string

const (
	// StateConnecting: no connection upstream yet, nothing overdue.
	StateConnecting State = "connecting"
	// StateConnected: connected, and every stream either has nothing to
	// send or was acknowledged within StallAfter.
	StateConnected State = "connected"
	// StateStalled: a stream has records to send and nothing was
	// acknowledged for StallAfter, connected or not.
	StateStalled State = "stalled"
	// StatePaused: paused through the API.
	StatePaused State = "paused"
	// StateStandby: in a site, another node leads the stream and sends it
	// (StreamStatus.Leader names it); this node sends it if it becomes the
	// leader.
	StateStandby State = "standby"
)

// States lists every State, for the peat_sink_state metric.
var States = []State{StateConnecting, StateConnected, StateStalled, StatePaused, StateStandby}

// Status is a sink as GET /api/v1/sinks shows it.
type Status struct {
	Name        string         `json:"name"`
	Kind        string         `json:"kind"`
	Upstream    string         `json:"upstream"`
	State       State          `json:"state"`
	Window      int            `json:"window"` // of the current connection; 0 when not connected
	Reconnects  uint64         `json:"reconnects"`
	LastError   string         `json:"last_error,omitempty"`
	LastErrorAt *time.Time     `json:"last_error_at,omitempty"`
	Streams     []StreamStatus `json:"streams"`
}

// StreamStatus is a sink's progress in one stream.
type StreamStatus struct {
	Stream          string     `json:"stream"`
	State           State      `json:"state"`
	CommittedOffset uint64     `json:"committed_offset"` // the sink's position
	EndOffset       uint64     `json:"end_offset"`       // the stream's committed end
	LagRecords      uint64     `json:"lag_records"`
	LagSeconds      float64    `json:"lag_seconds"` // age of the oldest record not yet acknowledged
	LastSuccess     *time.Time `json:"last_success,omitempty"`
	// Leader is, in a site, the node that leads the stream and so sends
	// it ("" while none is known); on a standby stream the position and
	// the lag are that node's to report, and are shown as 0 lag here.
	Leader string `json:"leader,omitempty"`
}

// Status reports the sink's health now.
func (s *Sink) Status() Status {
	now := time.Now()
	st := Status{
		Name:       s.cfg.Name,
		Upstream:   s.cfg.Upstream.String(),
		Window:     int(s.window.Load()),
		Reconnects: s.reconnects.Load(),
		State:      StateConnecting,
	}
	s.mu.Lock()
	if s.mu.lastErr != "" {
		at := s.mu.lastErrAt
		st.LastError, st.LastErrorAt = s.mu.lastErr, &at
	}
	s.mu.Unlock()
	for i, c := range s.cursors() {
		ss := s.streamStatus(c, now)
		st.Streams = append(st.Streams, ss)
		if i == 0 {
			st.State = ss.State
		}
		st.State = worse(st.State, ss.State)
	}
	return st
}

// worse is the state a sink shows for two of its streams.
func worse(a, b State) State {
	rank := map[State]int{StateStandby: -1, StateConnected: 0, StateConnecting: 1, StatePaused: 2, StateStalled: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

func (s *Sink) streamStatus(c *cursor, now time.Time) StreamStatus {
	pos := c.position.Load()
	end := c.stream.Committed()
	ss := StreamStatus{Stream: c.name, CommittedOffset: pos, EndOffset: end}
	if ld := s.cfg.Leadership; ld != nil {
		var here bool
		ss.Leader, _, here = ld.Leader(c.name)
		// The position as this replica holds it: the leader's last commit,
		// ahead of the cursor's own until the pump takes the stream up.
		if off, ok, err := s.cfg.Positions.Load(Group(s.cfg.Name), c.name); err == nil && ok && (off > pos || !here) {
			ss.CommittedOffset = off
		}
		if here {
			return s.ownStatus(c, ss, now)
		}
		// Another node sends it: no lag or stall of this node's own.
		c.progressAt.Store(now.UnixNano())
		ss.State = StateStandby
		return ss
	}
	return s.ownStatus(c, ss, now)
}

// ownStatus is the status of a stream this node sends.
func (s *Sink) ownStatus(c *cursor, ss StreamStatus, now time.Time) StreamStatus {
	pos, end := ss.CommittedOffset, ss.EndOffset
	if end > pos {
		ss.LagRecords = end - pos
		from := max(pos, c.stream.FirstOffset())
		if recs, err := c.stream.Read(from, 1, 1); err == nil && len(recs) == 1 {
			ss.LagSeconds = max(0, now.Sub(time.UnixMilli(recs[0].Timestamp)).Seconds())
		}
	}
	if ns := c.lastSuccess.Load(); ns != 0 {
		t := time.Unix(0, ns)
		ss.LastSuccess = &t
	}
	if ss.LagRecords == 0 {
		c.progressAt.Store(now.UnixNano())
	}
	stalled := ss.LagRecords > 0 && now.Sub(time.Unix(0, c.progressAt.Load())) > s.cfg.StallAfter
	switch {
	case s.paused.Load():
		ss.State = StatePaused
	case stalled:
		ss.State = StateStalled
	case s.connected.Load():
		ss.State = StateConnected
	default:
		ss.State = StateConnecting
	}
	return ss
}

// monitor keeps the stall clocks and the gauges current, and logs a
// stream's entering and leaving the stalled state. It alone writes and
// deletes the gauges, so a stream's series removed when the sink stops
// sending it (RemoveStream) cannot come back from a late update; when
// Run ends, the sink's series go too.
func (s *Sink) monitor(ctx context.Context) {
	tick := min(time.Second, max(s.cfg.StallAfter/4, 10*time.Millisecond))
	t := time.NewTicker(tick)
	defer t.Stop()
	defer s.m.forget()
	last := map[string]State{}
	shown := map[*cursor]bool{}
	for {
		now := time.Now()
		cursors := s.cursors()
		names := make(map[string]bool, len(cursors))
		for _, c := range cursors {
			names[c.name] = true
			shown[c] = true
			ss := s.streamStatus(c, now)
			c.m.set(ss)
			if prev := last[c.name]; prev != ss.State {
				if ss.State == StateStalled {
					s.log.Warn("sink stalled: records to send and nothing acknowledged", attrStream, c.name,
						attrLag, ss.LagRecords, attrStallAfter, s.cfg.StallAfter)
				} else if prev == StateStalled {
					s.log.Info("sink no longer stalled", attrStream, c.name, attrState, string(ss.State))
				}
				last[c.name] = ss.State
			}
		}
		for c := range shown {
			if slices.Contains(cursors, c) {
				continue
			}
			delete(shown, c)
			if !names[c.name] { // not added again meanwhile (it shares the series then)
				c.m.forget()
				delete(last, c.name)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.monitorWake:
		}
	}
}
