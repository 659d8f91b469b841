package mqtt

import "sort"

// Read-only views of the broker's consumer state, for the node's status
// API, page and metrics. They copy what they return under the registries'
// locks and never block delivery for longer than that copy.

// GroupState is one consumer group's position in one stream, as this node
// knows it.
type GroupState struct {
	Group  string
	Stream string
	// Committed is the group's committed offset (the next offset it will
	// be given), acknowledgements included that have not reached the store
	// yet. Known is false for a group that has a consumer but never
	// committed: it starts where mqtt.group_start says once it does.
	Committed uint64
	Known     bool
	// Holder is the client id of the group's active consumer in the
	// stream, "" when none is connected.
	Holder string
}

// Groups lists the consumer groups of this node by group, then stream:
// those that ever committed and those with a consumer now.
func (b *Broker) Groups() []GroupState {
	gs := b.deliv.groups
	gs.mu.Lock()
	out := make([]GroupState, 0, len(gs.m))
	for k, e := range gs.m {
		holder := ""
		if o := e.owner; o != nil && o.ctx.Err() == nil {
			holder = o.c.id
		}
		if !e.known && holder == "" {
			continue // only watched through $offsets
		}
		out = append(out, GroupState{Group: k.group, Stream: k.stream, Committed: e.position, Known: e.known, Holder: holder})
	}
	gs.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Group != out[j].Group {
			return out[i].Group < out[j].Group
		}
		return out[i].Stream < out[j].Stream
	})
	return out
}

// SessionsState sums up the durable sessions.
type SessionsState struct {
	Count     int // durable sessions, connected or not
	Connected int // of which a connection holds now
	// MaxLag is the most records any session is behind in one stream
	// (the stream's committed end minus the session's position there);
	// MaxLagClient and MaxLagStream name it. $replay subscriptions of a
	// session are not counted: their cursor is the client's choice.
	MaxLag       uint64
	MaxLagClient string
	MaxLagStream string
}

// Sessions sums up the durable sessions. Per-session detail stays out:
// there may be thousands.
func (b *Broker) Sessions() SessionsState {
	ss := b.deliv.sessions
	type pos struct {
		client, stream string
		off            uint64
	}
	var out SessionsState
	var positions []pos
	ss.mu.Lock()
	for id, s := range ss.m {
		if s.transient {
			continue
		}
		out.Count++
		if s.conn != nil {
			out.Connected++
		}
		for c, off := range s.cursors {
			if c.tap == "" {
				positions = append(positions, pos{id, c.stream, off})
			}
		}
	}
	ss.mu.Unlock()
	// Streams are looked up outside the registry's lock.
	for _, p := range positions {
		st := b.deliv.log.Stream(p.stream)
		if st == nil {
			continue
		}
		end := st.Committed()
		if p.off >= end {
			continue
		}
		if lag := end - p.off; lag > out.MaxLag || (lag == out.MaxLag && p.client < out.MaxLagClient) {
			out.MaxLag, out.MaxLagClient, out.MaxLagStream = lag, p.client, p.stream
		}
	}
	return out
}
