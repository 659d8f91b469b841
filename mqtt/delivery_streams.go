package mqtt

import (
	"fmt"
	"slices"

	"github.com/peatmq/peat/logstore"
)

// Streams change while the broker runs (a cluster controller adds streams
// and moves leaders). Delivery follows Log.WatchStreams:
//
//   - A stream added gets its shared reader, and every connected client
//     joins it live at the stream's committed offset when delivery learns
//     of it (0 for a new stream): existing plain and $share subscriptions
//     whose filters match its topics receive its records from that offset
//     on, as a client connecting then would. $replay and $group
//     subscriptions name one stream when they are made, so only those made
//     after the stream is added can name it. Ingest needs nothing: it routes
//     every publish with Log.Route, which already routes by the new stream.
//   - A stream removed has its reader and its lagging consumers' cursors
//     stopped, and the $replay and $group subscriptions reading it stop
//     receiving: the subscription stays (no DISCONNECT, no UNSUBACK; MQTT
//     has no way to end one from the server) but gets nothing more. Its
//     retained messages, groups and session offsets go with it.
//     Publishes to its topics go to the next matching stream by Log.Route,
//     or through mochi unchanged when none matches.

// addReader loads the consumer state of s (its groups' offsets, the
// sessions' offsets in it) and starts its reader. A stream whose name
// already has a reader is skipped: either it is that reader's (the initial
// events repeat Streams), or a newer stream of that name replaced it before
// this event was handled.
func (d *delivery) addReader(s Stream) {
	d.mu.Lock()
	known := d.mu.byName[s.Name()] != nil
	d.mu.Unlock()
	if known {
		return
	}
	moved := s.StateMoved()
	if err := d.loadState(s); err != nil {
		d.logger.Error("delivery: added stream's consumer state unreadable; its groups and sessions start afresh",
			attrStream, s.Name(), attrErr, err)
	}
	d.startReader(s, moved)
}

// loadState reads the consumer state of s: its groups' committed offsets
// and the sessions' offsets in it.
func (d *delivery) loadState(s Stream) error {
	if err := d.groups.load(s); err != nil {
		return fmt.Errorf("load consumer groups: %w", err)
	}
	if err := d.sessions.loadCursors(s); err != nil {
		return fmt.Errorf("load durable sessions' offsets: %w", err)
	}
	return nil
}

// startReader starts the shared reader of s, joins the connected clients
// to it, and loads its consumer state again each time it moves (moved is
// StateMoved as taken before the state was loaded).
func (d *delivery) startReader(s Stream, moved <-chan struct{}) {
	d.mu.Lock()
	if d.mu.byName[s.Name()] != nil || d.ctx.Err() != nil {
		d.mu.Unlock()
		return
	}
	r := newDeliveryReader(d, s)
	d.mu.readers = append(d.mu.readers, r)
	d.mu.byName[s.Name()] = r
	for _, c := range d.mu.clients {
		r.join(c)
	}
	d.wg.Add(2)
	go r.run()
	go d.followState(r, moved)
	d.mu.Unlock()
	// The stream's retained messages follow its committed log for as long
	// as its reader lives (retained.go); the rebuild reads, so not under d.mu.
	r.retainedDone = d.retained.start(r.ctx, d, s)
}

// followState loads the consumer state of r's stream again whenever it
// moves (a cluster made this node its leader), until the reader stops.
func (d *delivery) followState(r *deliveryReader, moved <-chan struct{}) {
	defer d.wg.Done()
	for {
		select {
		case <-moved:
		case <-r.ctx.Done():
			return
		}
		moved = r.stream.StateMoved()
		if err := d.loadState(r.stream); err != nil {
			d.logger.Error("delivery: stream's consumer state moved here but is unreadable",
				attrStream, r.stream.Name(), attrErr, err)
			continue
		}
		d.logger.Info("delivery: stream's consumer state moved here; groups and sessions continue from it",
			attrStream, r.stream.Name())
	}
}

// removeReader stops the reader of s (matched by identity: a stream of the
// same name added later keeps its own) and the taps reading through it.
func (d *delivery) removeReader(s Stream) {
	d.mu.Lock()
	i := slices.IndexFunc(d.mu.readers, func(r *deliveryReader) bool { return r.stream == s })
	if i < 0 {
		d.mu.Unlock()
		return
	}
	r := d.mu.readers[i]
	d.mu.readers = slices.Delete(slices.Clone(d.mu.readers), i, i+1) // OnDisconnect may range over the old slice
	if d.mu.byName[s.Name()] == r {
		delete(d.mu.byName, s.Name())
	}
	clients := make([]*deliveryClient, 0, len(d.mu.clients))
	for _, c := range d.mu.clients {
		clients = append(clients, c)
	}
	d.mu.Unlock()
	r.cancel()
	for _, c := range clients {
		c.stopTapsOf(r)
	}
	<-r.retainedDone // before a stream of the same name may start its own
	d.retained.forget(s.Name())
	d.groups.drop(s.Name())
	d.sessions.dropStream(s.Name())
	d.m.Received.DeleteLabelValues(s.Name())
	d.m.Delivered.DeleteLabelValues(s.Name())
	d.logger.Info("delivery: stream removed; its reader and taps stopped", attrStream, s.Name())
}

// stopTapsOf stops the client's taps that read through r.
func (c *deliveryClient) stopTapsOf(r *deliveryReader) {
	c.mu.Lock()
	var stop []*tap
	for _, t := range c.mu.taps {
		if t.r == r {
			stop = append(stop, t)
		}
	}
	c.mu.Unlock()
	for _, t := range stop {
		t.stop()
	}
}

// followStreams applies the log's stream changes until the delivery
// closes or the log does.
func (d *delivery) followStreams(events <-chan StreamEvent, cancel func()) {
	defer d.wg.Done()
	defer cancel()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return
			}
			switch ev.Kind {
			case logstore.StreamAdded:
				d.addReader(ev.Stream)
			case logstore.StreamRemoved:
				d.removeReader(ev.Stream)
			}
		case <-d.ctx.Done():
			return
		}
	}
}
