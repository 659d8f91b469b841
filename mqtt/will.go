package mqtt

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// delayedWill is a will waiting out its Will Delay Interval.
type delayedWill struct {
	timer *time.Timer
}

// OnSessionEstablish runs for a new connection before it takes over an
// older one with the same client id: it cancels that client's delayed will
// [MQTT-3.1.3-9], and drops the old connection's PUBRECs that are not yet
// durable so the new connection does not inherit and resend them early.
func (h *ingest) OnSessionEstablish(cl *mochi.Client, _ packets.Packet) {
	h.cancelWill(cl.ID)
	if old, ok := h.srv.Clients.Get(cl.ID); ok && old != cl {
		if c, ok := h.conns.Load(old); ok {
			c.(*ingestConn).dropPendingPlaceholders()
		}
	}
}

// OnSessionEstablished counts the client and takes a will on a captured (or
// reserved) topic away from mochi, whose sendLWT would fan it out directly:
// ingest appends it when the connection ends abnormally.
func (h *ingest) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	h.m.Connected.Inc()
	if cl.Net.Inline || atomic.LoadUint32(&cl.Properties.Will.Flag) == 0 {
		return
	}
	w := cl.Properties.Will
	if !reservedTopic(w.TopicName) && h.log.Route(w.TopicName) == nil {
		return // mochi sends it, as for any topic no stream captures
	}
	c := h.conn(cl)
	c.mu.Lock()
	c.mu.will = &w
	c.mu.Unlock()
	atomic.StoreUint32(&cl.Properties.Will.Flag, 0) // mochi's sendLWT skips it now
}

// OnDisconnect drops the client's ingest state and, when the connection
// ended without a normal DISCONNECT (err != nil, as for mochi's sendLWT),
// sends its will. Closing the broker sends no wills.
func (h *ingest) OnDisconnect(cl *mochi.Client, err error, _ bool) {
	h.m.Connected.Dec()
	v, ok := h.conns.LoadAndDelete(cl)
	if !ok {
		return
	}
	c := v.(*ingestConn)
	c.mu.Lock()
	w := c.mu.will
	c.mu.will = nil
	c.mu.Unlock()
	if w == nil || (err == nil && !disconnectedForError(cl)) || h.isClosing() {
		return
	}
	if w.WillDelayInterval == 0 {
		h.appendWill(cl.ID, *w)
		return
	}
	h.scheduleWill(cl, *w)
}

// disconnectedForError reports whether the server sent cl a DISCONNECT
// with an error reason (a protocol error: the will is sent). mochi's read
// loop then ends without an error when the DISCONNECT came from a hook.
func disconnectedForError(cl *mochi.Client) bool {
	var code packets.Code
	return errors.As(cl.StopCause(), &code) && code.Code >= packets.ErrUnspecifiedError.Code &&
		code.Code != packets.ErrServerShuttingDown.Code
}

// scheduleWill appends w after its delay, unless the client reconnects
// first or the broker closes.
func (h *ingest) scheduleWill(cl *mochi.Client, w mochi.Will) {
	id := cl.ID
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return
	}
	if old := h.mu.wills[id]; old != nil && old.timer.Stop() {
		h.wg.Done()
	}
	dw := &delayedWill{}
	h.wg.Add(1)
	dw.timer = time.AfterFunc(time.Duration(w.WillDelayInterval)*time.Second, func() {
		defer h.wg.Done()
		h.mu.Lock()
		mine := h.mu.wills[id] == dw
		if mine {
			delete(h.mu.wills, id)
		}
		h.mu.Unlock()
		if !mine {
			return // cancelled or replaced while firing
		}
		if cur, ok := h.srv.Clients.Get(id); ok && cur != cl && !cur.Closed() {
			return // the session was resumed by a new connection
		}
		h.appendWill(id, w)
	})
	h.mu.wills[id] = dw
}

// cancelWill cancels a delayed will of client id, if one waits.
func (h *ingest) cancelWill(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if dw := h.mu.wills[id]; dw != nil {
		delete(h.mu.wills, id)
		if dw.timer.Stop() {
			h.wg.Done()
		}
	}
}

// appendWill appends a will as the publish it stands for. Nobody waits for
// an ack; a failure is counted and logged.
func (h *ingest) appendWill(clientID string, w mochi.Will) {
	if reservedTopic(w.TopicName) {
		h.m.Refused.WithLabelValues(ReasonReadOnly).Inc()
		return
	}
	if len(w.Payload) > h.cfg.MaxPayload {
		h.m.Refused.WithLabelValues(ReasonTooLarge).Inc()
		return
	}
	st := h.log.Route(w.TopicName)
	if st == nil {
		return
	}
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: w.Qos, Retain: w.Retain},
		TopicName:   w.TopicName,
		Payload:     w.Payload,
		Properties:  packets.Properties{User: w.User},
		Origin:      clientID,
		Created:     time.Now().Unix(),
	}
	st.AppendAsync([]*logstore.Record{recordOf(clientID, &pk)}, func(_ uint64, err error) {
		h.appended(st, err)
		if err != nil {
			h.logger.Debug("will not stored", slog.String(attrClient, clientID),
				slog.String(attrTopic, w.TopicName), slog.Any(attrErr, err))
		}
	})
}
