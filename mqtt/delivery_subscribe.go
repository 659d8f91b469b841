package mqtt

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Subscribing to extension topics.
//
// mochi accepts $replay/..., $group/... and $offsets/... filters as ordinary
// ones (they stay in its topic index, where no publish ever matches them).
// The delivery hook does the rest, in the order mochi calls it:
//
//	OnSubscribe     parse each extension filter, find its stream, check the
//	                ACL on the inner filter, resolve the start offset, take
//	                group ownership, and build a tap (not started); a refused
//	                filter is blanked, so mochi refuses it too (0x8F)
//	OnSubscribed    put the right reason code on refused filters (the
//	                SUBACK's code slice is shared), install accepted taps
//	OnPacketEncode  add the reason string and, for MQTT 5, the user
//	                properties stream, start, end, client (when asked) and
//	                notice to the SUBACK
//	OnPacketSent    start the taps once the SUBACK is out, so a client sees
//	                the SUBACK before the first replayed record
//
// The plan between these steps is kept per client by SUBSCRIBE packet id.

// subackPlan is what a SUBSCRIBE with extension filters needs its SUBACK
// and its taps to do.
type subackPlan struct {
	taps    map[int]*tap      // accepted, by filter index
	refused map[int]*tapError // by filter index
	props   []packets.UserProperty
}

// SUBACK reason codes for refused extension filters.
const (
	subackInvalid       = 0x8F // topic filter invalid: the grammar
	subackNotAccepted   = 0x83 // implementation specific: valid, but not served (no stream, two streams, group taken)
	subackNotAuthorized = 0x87
)

// OnSubscribe refuses the filters deeper than Config.MaxTopicLevels and
// prepares the extension filters of a SUBSCRIBE.
func (d *delivery) OnSubscribe(cl *mochi.Client, pk packets.Packet) packets.Packet {
	var plan *subackPlan
	var c *deliveryClient
	now := time.Now()
	clients := asksClients(pk.Properties.User)
	for i := range pk.Filters {
		sub := pk.Filters[i]
		deep := tooDeep(sub.Filter, d.cfg.MaxTopicLevels)
		var ext extFilter
		var err error
		if !deep {
			ext, err = parseExtension(sub.Filter, now)
			if err == nil && ext.kind == extNone {
				continue
			}
		}
		if plan == nil {
			plan = &subackPlan{taps: map[int]*tap{}, refused: map[int]*tapError{}}
			c = d.attach(cl)
		}
		var t *tap
		var refusal *tapError
		switch {
		case deep: // before mochi indexes it (topiclevels.go)
			d.m.Denied.WithLabelValues(DeniedTopicLevels).Inc()
			refusal = &tapError{code: subackInvalid, reason: topicLevelsReason("topic filter", d.cfg.MaxTopicLevels)}
			sub.Filter = fmt.Sprintf("%.64s...", sub.Filter) // for the log line
		case c == nil:
			refusal = &tapError{code: subackNotAccepted, reason: "broker shutting down"}
		case err != nil:
			refusal = &tapError{code: subackInvalid, reason: err.Error()}
		default:
			t, refusal = d.prepareTap(c, sub, ext, false)
		}
		if refusal != nil {
			plan.refused[i] = refusal
			pk.Filters[i].Filter = "" // mochi refuses it without touching its index
			d.logger.Info("delivery: subscription refused", attrClient, cl.ID,
				attrFilter, sub.Filter, attrReason, refusal.reason)
			continue
		}
		plan.taps[i] = t
		if t.r != nil {
			plan.props = append(plan.props,
				packets.UserProperty{Key: propStream, Val: t.r.stream.Name()},
				packets.UserProperty{Key: propStart, Val: strconv.FormatUint(t.start, 10)},
				packets.UserProperty{Key: propEnd, Val: strconv.FormatUint(t.r.stream.Committed(), 10)})
			if t.clients = clients; clients {
				plan.props = append(plan.props, packets.UserProperty{Key: propClient, Val: "true"})
			}
		}
	}
	if plan != nil && c != nil {
		c.mu.Lock()
		if c.mu.subacks == nil {
			c.mu.subacks = map[uint16]*subackPlan{}
		}
		c.mu.subacks[pk.PacketID] = plan
		c.mu.Unlock()
	}
	d.retainedSubscribe(cl, pk) // delivery_retained.go
	return pk
}

// prepareTap builds the tap of one extension subscription, or says why it
// is refused. resume is set for a subscription a durable session had: a
// $replay goes on from where the client got to, not from <from> again.
func (d *delivery) prepareTap(c *deliveryClient, sub packets.Subscription, ext extFilter, resume bool) (*tap, *tapError) {
	if refusal := d.groupRefusal(c, ext); refusal != nil { // tenancy.go
		return nil, refusal
	}
	t := newTap(c, sub, ext)
	if ext.kind == extOffsets {
		if d.reader(ext.stream) == nil {
			return nil, &tapError{code: subackNotAccepted, reason: fmt.Sprintf("no stream %q", ext.stream)}
		}
		t.group = groupKey{group: ext.group, stream: ext.stream}
		return t, nil
	}
	streams, err := streamsReached(d.log, ext.inner)
	switch {
	case err != nil:
		return nil, &tapError{code: subackNotAccepted, reason: fmt.Sprintf("filter %q: %v", ext.inner, err)}
	case len(streams) == 0:
		return nil, &tapError{code: subackNotAccepted, reason: fmt.Sprintf("no stream captures topics matching %q", ext.inner)}
	case len(streams) > 1:
		names := make([]string, len(streams))
		for i, s := range streams {
			names[i] = s.Name()
		}
		return nil, &tapError{code: subackNotAccepted, reason: fmt.Sprintf(
			"filter %q spans streams %s: a replay reads one stream's offsets; subscribe once per stream with narrower filters",
			ext.inner, strings.Join(names, ", "))}
	}
	if !d.canRead(c.cl, ext.inner) {
		d.m.Denied.WithLabelValues(DeniedSubscribe).Inc()
		return nil, &tapError{code: subackNotAuthorized, reason: fmt.Sprintf("not authorized to read %q", ext.inner)}
	}
	if t.r = d.reader(streams[0].Name()); t.r == nil {
		// The Log has the stream, delivery has not taken its StreamAdded
		// yet (a stream created at run time): a moment later it will.
		return nil, &tapError{code: subackNotAccepted, reason: fmt.Sprintf("stream %s is starting; subscribe again", streams[0].Name())}
	}
	s := t.r.stream
	var notice string
	switch ext.kind {
	case extReplay:
		t.start, notice = d.resolve(s, ext.from)
		if c.durable {
			key := cursorKey{stream: s.Name(), tap: sub.Filter}
			if off, ok := d.sessions.offset(c.id, key); ok && resume {
				t.start, notice = d.resolve(s, position{kind: posOffset, offset: off})
			}
			t.prog = newProgress(t.start, func(v uint64) { d.sessions.advance(c.id, key, v) })
			t.rs, t.untrack = d.sessions.track(c.id, key, nil)
		}
	case extGroup:
		t.group = groupKey{group: ext.group, stream: s.Name()}
		if ok, holder := d.groups.acquire(t.group, t, s); !ok {
			return nil, &tapError{code: subackNotAccepted, reason: fmt.Sprintf(
				"group %q already has a consumer in stream %q (client %q); a group has one consumer at a time",
				ext.group, s.Name(), holder)}
		}
		if off, known := d.groups.position(t.group); known {
			t.start, notice = d.resolve(s, position{kind: posOffset, offset: off})
		} else {
			t.start, notice = d.resolve(s, d.cfg.groupStart())
		}
		key := t.group
		t.prog = newProgress(t.start, func(v uint64) { d.groups.advance(key, t, v) })
	}
	if notice != "" {
		d.m.StartAdjusted.Inc()
		d.logger.Info("delivery: "+notice, attrClient, c.id, attrFilter, sub.Filter)
		t.notice = notice
	}
	return t, nil
}

// resolve turns a <from> into the offset to read from in s, with a notice
// when it had to move it.
func (d *delivery) resolve(s Stream, p position) (uint64, string) {
	first := s.FirstOffset()
	switch p.kind {
	case posLatest:
		return s.Committed(), ""
	case posOffset:
		if p.offset < first {
			return first, fmt.Sprintf("offset %d is below the log start %d (retention); starting at %d", p.offset, first, first)
		}
		return p.offset, ""
	case posTime:
		off, err := s.OffsetForTime(p.at)
		if err != nil {
			d.logger.Warn("delivery: offset for time; starting at the log start", attrStream, s.Name(), attrErr, err)
			return first, fmt.Sprintf("could not look up %s; starting at the log start %d", p, first)
		}
		return max(off, first), ""
	default:
		return first, ""
	}
}

// onSubscribedTaps puts the reason codes of refused extension filters into the
// SUBACK and installs the accepted taps.
func (d *delivery) onSubscribedTaps(c *deliveryClient, pk packets.Packet, reasonCodes []byte) {
	c.mu.Lock()
	plan := c.mu.subacks[pk.PacketID]
	c.mu.Unlock()
	if plan == nil {
		return
	}
	for i := range reasonCodes {
		if e := plan.refused[i]; e != nil {
			reasonCodes[i] = e.code
			if !c.v5 {
				reasonCodes[i] = packets.ErrUnspecifiedError.Code // v3 knows only 0x80
			}
			continue
		}
		t := plan.taps[i]
		if t == nil {
			continue
		}
		if reasonCodes[i] >= packets.ErrUnspecifiedError.Code { // mochi refused it (ACL, packet id in use)
			delete(plan.taps, i)
			t.stop()
			d.groups.release(t.group, t)
			continue
		}
		c.installTap(t)
	}
}

// OnPacketEncode gives mochi's own deliveries Peat's packet ids
// (packetid.go), and adds the reason string and the replay properties to a
// SUBACK answering extension filters (MQTT 5; v3 SUBACKs carry neither).
//
// It also keeps user properties on PUBLISH for clients that set Request
// Problem Information to 0: mochi v2.7.9 then strips them from every packet,
// but [MQTT-3.1.2-29] forbids them only on packets other than PUBLISH,
// CONNACK and DISCONNECT, and a publisher's properties, and a replay's
// stream, offset and timestamp, belong to the message. (paho.golang sends 0
// whenever a client sets any CONNECT property without asking for problem
// information.)
func (d *delivery) OnPacketEncode(cl *mochi.Client, pk packets.Packet) packets.Packet {
	d.mochiWireID(cl, &pk) // mochi's deliveries leave with Peat's packet ids (packetid.go)
	if pk.FixedHeader.Type == packets.Publish {
		pk.Mods.DisallowProblemInfo = false
		return pk
	}
	if pk.FixedHeader.Type != packets.Suback || cl.Properties.ProtocolVersion != 5 {
		return pk
	}
	c := d.client(cl)
	if c == nil {
		return pk
	}
	c.mu.Lock()
	plan := c.mu.subacks[pk.PacketID]
	c.mu.Unlock()
	if plan == nil {
		return pk
	}
	var reasons []string
	for i := range pk.ReasonCodes {
		if e := plan.refused[i]; e != nil {
			reasons = append(reasons, e.reason)
		}
	}
	if len(reasons) > 0 {
		pk.Properties.ReasonString = strings.Join(reasons, "; ")
	}
	props := plan.props
	for i := range pk.ReasonCodes {
		if t := plan.taps[i]; t != nil && t.notice != "" {
			props = append(props, packets.UserProperty{Key: propNotice, Val: t.notice})
		}
	}
	if len(props) > 0 {
		pk.Properties.User = append(append([]packets.UserProperty(nil), pk.Properties.User...), props...)
	}
	return pk
}

// OnPacketSent starts the taps of a SUBSCRIBE once its SUBACK is out.
func (d *delivery) OnPacketSent(cl *mochi.Client, pk packets.Packet, _ []byte) {
	if pk.FixedHeader.Type != packets.Suback {
		return
	}
	c := d.client(cl)
	if c == nil {
		return
	}
	c.mu.Lock()
	plan := c.mu.subacks[pk.PacketID]
	delete(c.mu.subacks, pk.PacketID)
	c.mu.Unlock()
	if plan == nil {
		return
	}
	for _, t := range plan.taps {
		d.startTap(t)
	}
}

// OnUnsubscribed stops the taps of the filters a client unsubscribed from.
func (d *delivery) OnUnsubscribed(cl *mochi.Client, pk packets.Packet) {
	if persistent(cl) {
		filters := make([]string, len(pk.Filters))
		for i, f := range pk.Filters {
			filters[i] = f.Filter
		}
		d.sessions.unsubscribed(cl.ID, filters)
	}
	for _, f := range pk.Filters {
		d.subs.remove(cl, f.Filter)
	}
	c := d.client(cl)
	if c == nil {
		return
	}
	for _, f := range pk.Filters {
		c.removeTap(f.Filter)
		c.removeGate(f.Filter, nil)
	}
}

// startTap runs t, unless the delivery or the client has stopped.
func (d *delivery) startTap(t *tap) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if t.ctx.Err() != nil || d.ctx.Err() != nil {
		return
	}
	d.wg.Add(1)
	go t.run()
}

// resumeTaps starts taps for the extension subscriptions a client inherited
// from its session.
func (d *delivery) resumeTaps(c *deliveryClient) {
	now := time.Now()
	for _, sub := range c.cl.State.Subscriptions.GetAll() {
		ext, err := parseExtension(sub.Filter, now)
		if err != nil || ext.kind == extNone {
			continue
		}
		t, refusal := d.prepareTap(c, sub, ext, true)
		if refusal != nil {
			d.logger.Warn("delivery: session subscription not resumed", attrClient, c.id,
				attrFilter, sub.Filter, attrReason, refusal.reason)
			continue
		}
		t.clients = d.sessions.asksClients(c.id, sub.Filter)
		c.installTap(t)
		d.startTap(t)
	}
}

// canRead reports whether cl may subscribe to filter: some topic matching
// it is readable. Each record is checked again as it is delivered
// (deliveryClient.item).
func (d *delivery) canRead(cl *mochi.Client, filter string) bool {
	if d.auth == nil || cl.Net.Inline {
		return true
	}
	acc := accessOf(cl)
	return acc != nil && acc.MaySubscribe(filter)
}

// OnACLCheck lets $replay/, $group/ and $offsets/ subscriptions through
// mochi's own check of the whole filter: OnSubscribe checks the filter
// inside them, over the original topics, which is what an ACL is written
// for, and the group's rules (tenancy.go).
func (d *delivery) OnACLCheck(_ *mochi.Client, topic string, write bool) bool {
	return !write && (strings.HasPrefix(topic, replayPrefix) || strings.HasPrefix(topic, groupPrefix) ||
		strings.HasPrefix(topic, offsetsPrefix))
}

// reader returns the shared reader of the named stream, or nil.
func (d *delivery) reader(stream string) *deliveryReader {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.mu.byName[stream]
}
