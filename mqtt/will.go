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

// will is a client's last will with the properties mochi's Will leaves
// out: mochi keeps only the User Properties of the CONNECT's Will
// Properties, and a will is published with all of them (Payload Format
// Indicator, Message Expiry Interval, Content Type, Response Topic,
// Correlation Data: MQTT 5 3.1.3.2).
type will struct {
	mochi.Will
	props packets.Properties
	// acc is the client's Access (nil without Auth): a will is judged
	// when it fires, under the rules then in force.
	acc Access
}

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

// OnSessionEstablished counts the client and takes its will away from
// mochi, whose sendLWT would publish it with its User Properties alone:
// ingest publishes it, with all its properties, when the connection ends
// abnormally (appendWill).
func (h *ingest) OnSessionEstablished(cl *mochi.Client, connect packets.Packet) {
	h.m.Connected.Inc()
	if cl.Net.Inline || atomic.LoadUint32(&cl.Properties.Will.Flag) == 0 {
		return
	}
	w := &will{Will: cl.Properties.Will, props: connect.Connect.WillProperties, acc: accessOf(cl)}
	c := h.conn(cl)
	c.mu.Lock()
	c.mu.will = w
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

// willPublishProps are the properties a will is published with: its Will
// Properties but the Will Delay Interval [MQTT-3.3.2-4] [MQTT-3.3.2-15]
// [MQTT-3.3.2-16] [MQTT-3.3.2-20].
func willPublishProps(wp *packets.Properties) packets.Properties {
	return packets.Properties{
		PayloadFormat:         wp.PayloadFormat,
		PayloadFormatFlag:     wp.PayloadFormatFlag,
		MessageExpiryInterval: wp.MessageExpiryInterval,
		ContentType:           wp.ContentType,
		ResponseTopic:         wp.ResponseTopic,
		CorrelationData:       wp.CorrelationData,
		User:                  wp.User,
	}
}

// willOnDisconnect makes mochi treat a v5 DISCONNECT whose reason is not
// 0x00 (Normal disconnection) as 0x04 (Disconnect with Will Message): the
// will is published for every other reason [MQTT-3.1.2-8], and mochi
// publishes it only for 0x04. mochi also reads no reason code from a
// DISCONNECT of remaining length 1 (the reason code alone, MQTT 5
// 3.14.2.2.1); the connection guard, which checked the packet on the
// same goroutine before mochi read it, has it.
func willOnDisconnect(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if cl.Properties.ProtocolVersion != 5 {
		return pk
	}
	reason := pk.ReasonCode
	if gc := guardOf(cl); gc != nil && pk.FixedHeader.Remaining == 1 {
		reason = gc.fr.disconnectReason
	}
	if reason != packets.CodeSuccess.Code {
		pk.ReasonCode = packets.CodeDisconnectWillMessage.Code
	}
	return pk
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
func (h *ingest) scheduleWill(cl *mochi.Client, w will) {
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

// appendWill appends a will as the publish it stands for, or, on a topic
// no stream captures, hands it to mochi to fan out. Nobody waits for an
// ack; a failure is counted and logged.
func (h *ingest) appendWill(clientID string, w will) {
	if reservedTopic(w.TopicName) {
		h.m.Refused.WithLabelValues(ReasonReadOnly).Inc()
		return
	}
	if len(w.Payload) > h.cfg.MaxPayload {
		h.m.Refused.WithLabelValues(ReasonTooLarge).Inc()
		return
	}
	if w.acc != nil && !w.acc.MayPublish(w.TopicName) {
		h.m.Denied.WithLabelValues(DeniedPublish).Inc()
		h.logger.Debug("will not authorized", slog.String(attrClient, clientID), slog.String(attrTopic, w.TopicName))
		return
	}
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: w.Qos, Retain: w.Retain},
		TopicName:   w.TopicName,
		Payload:     w.Payload,
		Properties:  willPublishProps(&w.props),
		Origin:      clientID,
		Created:     time.Now().Unix(),
	}
	st := h.log.Route(w.TopicName)
	if st == nil {
		h.publishUncaptured(clientID, pk)
		return
	}
	st.AppendAsync([]*logstore.Record{recordOf(clientID, &pk)}, func(_ uint64, err error) {
		h.appended(st, err)
		if err != nil {
			h.logger.Debug("will not stored", slog.String(attrClient, clientID),
				slog.String(attrTopic, w.TopicName), slog.Any(attrErr, err))
		}
	})
}

// publishUncaptured publishes pk, a will on a topic no stream captures,
// through mochi as a client of the broker's own would: mochi retains it
// if asked and fans it out with its properties (mochi's own sendLWT keeps
// only the User Properties). The will was judged by the ACL already.
func (h *ingest) publishUncaptured(clientID string, pk packets.Packet) {
	inline := h.srv.NewClient(nil, mochi.LocalListener, mochi.InlineClientId, true)
	if pk.FixedHeader.Qos > 0 {
		pk.PacketID = 1 // mochi's validity check wants one; nothing is acked
	}
	if err := h.srv.InjectPacket(inline, pk); err != nil {
		h.logger.Debug("will not published", slog.String(attrClient, clientID),
			slog.String(attrTopic, pk.TopicName), slog.Any(attrErr, err))
	}
}
