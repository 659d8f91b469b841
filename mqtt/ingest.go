package mqtt

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// ingestOrigin marks the PUBRECs ingest puts into a client's Inflight map, so
// a resent QoS 2 PUBLISH can be told from one mochi handles itself.
const ingestOrigin = "peat-ingest"

// holdsPlaceholder reports whether cl's Inflight holds ingest's PUBREC for id.
func holdsPlaceholder(cl *mochi.Client, id uint16) bool {
	in, ok := cl.State.Inflight.Get(id)
	return ok && in.FixedHeader.Type == packets.Pubrec && in.Origin == ingestOrigin
}

// Reason codes of refused publishes (MQTT 5 PUBACK/PUBREC).
var (
	codeNotSaved  = packets.Code{Code: packets.ErrUnspecifiedError.Code, Reason: "not stored"}
	codeReserved  = packets.Code{Code: packets.ErrTopicNameInvalid.Code, Reason: "reserved topic: $SYS, $replay/ and $group/ are read-only"}
	codeBadOffset = packets.Code{Code: packets.ErrPayloadFormatInvalid.Code, Reason: "an $offsets commit's payload must be a decimal offset"}
	codeMirror    = packets.Code{Code: packets.ErrTopicNameInvalid.Code, Reason: "the stream of this topic is a mirror: only its source writes it, through $mirror/"}
)

// isMirror reports whether st is a mirror stream (edge/mirror): its
// offsets are its source's, so no publish may append to it.
func isMirror(st Stream) bool {
	m, ok := st.(interface{ Mirror() bool })
	return ok && m.Mirror()
}

// reservedPrefixes are topics closed to publishers: the broker's own
// (mochi's prefix, which it drops without an answer) and the replay
// protocol's.
var reservedPrefixes = []string{mochi.SysPrefix, "$replay/", "$group/"}

func reservedTopic(topic string) bool {
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(topic, p) {
			return true
		}
	}
	return false
}

// ingest is the mochi hook that takes publishes on captured topics into the
// log and acks them once durable (see doc.go).
type ingest struct {
	mochi.HookBase
	srv    *mochi.Server
	log    Log
	cfg    Config
	m      *Metrics
	logger *slog.Logger
	panics panics
	tooBig packets.Code
	// acl is the broker's auth hook if it checks ACLs (nil if not): it
	// decides which publishes early takes.
	acl    mochi.Hook
	groups *groups // commits published to $offsets/<group>/<stream>

	conns   sync.Map      // *mochi.Client -> *ingestConn
	closing chan struct{} // closed by beginClose

	mu struct {
		sync.Mutex
		closed bool                    // no more drainers or will timers start
		wills  map[string]*delayedWill // by client id
	}
	wg sync.WaitGroup // ack drainers and scheduled wills

	failMu  sync.Mutex
	failing map[string]bool // streams whose last append failed
}

var _ mochi.Hook = (*ingest)(nil)

func newIngest(srv *mochi.Server, log Log, cfg Config, m *Metrics, logger *slog.Logger, authHook mochi.Hook, gs *groups) *ingest {
	h := &ingest{
		groups:  gs,
		srv:     srv,
		log:     log,
		cfg:     cfg,
		m:       m,
		logger:  logger.With(slog.String(attrPart, "ingest")),
		panics:  panics{m: m, logs: newConnLog(logger)},
		closing: make(chan struct{}),
		failing: map[string]bool{},
		tooBig: packets.Code{
			Code:   packets.ErrQuotaExceeded.Code, // 0x95 is not a valid PUBACK reason; 0x97 is
			Reason: fmt.Sprintf("payload above max_payload (%d bytes)", cfg.MaxPayload),
		},
	}
	h.mu.wills = map[string]*delayedWill{}
	if authHook != nil && authHook.Provides(mochi.OnACLCheck) {
		h.acl = authHook
	}
	return h
}

// ID names the hook.
func (h *ingest) ID() string { return "peat-ingest" }

// Provides reports the hook events ingest handles.
func (h *ingest) Provides(b byte) bool {
	switch b {
	case mochi.OnPacketRead, mochi.OnPublish, mochi.OnPacketProcessed, mochi.OnConnect,
		mochi.OnSessionEstablish, mochi.OnSessionEstablished, mochi.OnDisconnect:
		return true
	}
	return false
}

// writes: OnPacketEncode runs on a client's write goroutine (panics.go).
func (h *ingest) writes(b byte) bool { return b == mochi.OnPacketEncode }

// beginClose makes publishers blocked on a full window give up, stops ack
// drainers and will timers from starting, and cancels scheduled wills.
func (h *ingest) beginClose() {
	h.mu.Lock()
	if h.mu.closed {
		h.mu.Unlock()
		return
	}
	h.mu.closed = true
	close(h.closing)
	for id, w := range h.mu.wills {
		delete(h.mu.wills, id)
		if w.timer.Stop() {
			h.wg.Done() // it will never run
		}
	}
	h.mu.Unlock()
}

// wait waits for the drainers and will appends started before beginClose.
func (h *ingest) wait() { h.wg.Wait() }

// goOwned starts f on a goroutine ingest waits for, unless closing.
func (h *ingest) goOwned(f func()) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return false
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		f()
	}()
	return true
}

func (h *ingest) isClosing() bool {
	select {
	case <-h.closing:
		return true
	default:
		return false
	}
}

// conn returns the ingest state of cl, creating it on first use. Idle
// clients that never publish to a captured topic have none.
func (h *ingest) conn(cl *mochi.Client) *ingestConn {
	if c, ok := h.conns.Load(cl); ok {
		return c.(*ingestConn)
	}
	c, _ := h.conns.LoadOrStore(cl, newIngestConn(h, cl))
	return c.(*ingestConn)
}

// OnPacketRead takes publishes on captured topics over as soon as they are
// read, ahead of mochi's processPublish, and hands mochi a no-op in their
// place (handled). On this path mochi's read goroutine stays within a 16 KiB
// stack; through processPublish to OnPublish it needs 32 KiB (go run
// ./scripts/stackprobe), which is most of the memory of 1,000 publishing
// sensors. So publishes mochi would treat specially are left to it, and
// reach OnPublish: they fail mochi's checks (validation, topic filter, ACL),
// carry a topic alias, exceed the maximum QoS, or reuse a packet id mochi
// has in flight. What mochi's processPublish does before OnPublish for the
// others, early repeats (stamping origin, time and expiry), except checking
// mochi's receive quota: that counts only the QoS 2 publishes mochi answers
// itself, on topics no stream captures; ingest's window bounds the rest.
//
// A resent QoS 2 PUBLISH whose PUBREC ingest owns is answered here, in queue
// order, without a second append: mochi would answer it with PUBREC 0x91
// before the record is durable.
func (h *ingest) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	switch pk.FixedHeader.Type {
	case packets.Publish:
	case packets.Pubrel:
		if c, ok := h.conns.Load(cl); ok {
			c.(*ingestConn).pubrel(pk.PacketID) // before mochi answers PUBCOMP
		}
		return pk, nil
	case packets.Disconnect:
		return willOnDisconnect(cl, pk), nil
	case packets.Connect:
		return emptyWillPayload(pk), nil
	default:
		return pk, nil
	}
	if pk.FixedHeader.Qos == 2 && holdsPlaceholder(cl, pk.PacketID) {
		h.conn(cl).resentQoS2(pk.PacketID)
		return handled, nil
	}
	taken, err := h.early(cl, &pk)
	if err != nil {
		// The client was sent a DISCONNECT (Receive Maximum exceeded).
		// mochi ignores other errors of OnPacketRead and goes on with the
		// packet; ErrRejectPacket ends its read loop with an error, so the
		// will is sent.
		return handled, packets.ErrRejectPacket
	}
	if taken {
		return handled, nil
	}
	return pk, nil
}

// handled is what OnPacketRead hands mochi for a publish ingest has taken:
// a PUBACK with packet id 0, which no publish of mochi's can have, so
// processPuback finds nothing in flight and does nothing (delivery skips it
// too).
var handled = packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}}

// isHandled reports whether pk is the no-op OnPacketRead left for mochi.
func isHandled(pk *packets.Packet) bool {
	return pk.FixedHeader.Type == packets.Puback && pk.PacketID == 0
}

// early takes pk over from OnPacketRead when mochi's processPublish would
// pass it to OnPublish unchanged (see OnPacketRead), and reports whether it
// did, or the error that ends the connection. Everything it calls stays
// shallow: the read goroutine has about 3.5 KB of its 16 KiB stack left
// here.
func (h *ingest) early(cl *mochi.Client, pk *packets.Packet) (bool, error) {
	caps := h.srv.Options.Capabilities
	if pk.Properties.TopicAliasFlag || pk.FixedHeader.Qos > caps.MaximumQos {
		return false, nil
	}
	st, owned := h.owner(pk.TopicName)
	switch {
	case !owned:
		return false, nil // mochi's, unchanged
	case st == nil && tooDeep(pk.TopicName, h.cfg.MaxTopicLevels):
		return true, h.routePublish(h.conn(cl), pk, nil) // refused before any matching
	case strings.HasPrefix(pk.TopicName, mochi.SysPrefix):
		// mochi would drop it with no answer; a QoS 1/2 publish must get
		// one [MQTT-4.3.2-4]: the refusal, whatever the ACL says.
		return true, h.routePublish(h.conn(cl), pk, nil)
	case pk.PublishValidate(caps.TopicAliasMaximum) != packets.CodeSuccess, !mochi.IsValidFilter(pk.TopicName, true):
		return false, nil
	case h.acl == nil || !mayPublishQuietly(h.acl, cl, pk.TopicName):
		return false, nil
	}
	if pk.FixedHeader.Qos > 0 {
		if _, ok := cl.State.Inflight.Get(pk.PacketID); ok {
			return false, nil // mochi answers or clears the clash
		}
	}
	pk.Origin = cl.ID
	pk.Created = time.Now().Unix()
	if exp := messageExpiry(caps.MaximumMessageExpiryInterval, int64(pk.Properties.MessageExpiryInterval)); exp > 0 {
		pk.Expiry = pk.Created + exp
	}
	return true, h.routePublish(h.conn(cl), pk, st)
}

// messageExpiry is mochi's rule for a publish's expiry in seconds: the
// smaller of the server's maximum and the publish's interval, ignoring
// either when zero.
func messageExpiry(maxInterval, interval int64) int64 {
	switch {
	case maxInterval == 0:
		return interval
	case interval == 0 || interval > maxInterval:
		return maxInterval
	}
	return interval
}

// owner returns the stream that captures topic, and whether ingest takes
// publishes to topic at all: a stream captures it, or it is one of the
// replay protocol's, or too deep to route (then the stream is nil).
func (h *ingest) owner(topic string) (Stream, bool) {
	if strings.HasPrefix(topic, offsetsPrefix) || reservedTopic(topic) || tooDeep(topic, h.cfg.MaxTopicLevels) {
		return nil, true
	}
	st := h.log.Route(topic)
	return st, st != nil
}

// OnPacketEncode tells MQTT 5 clients the largest packet Peat accepts
// (mochi enforces Maximum Packet Size but does not advertise it) and how
// many topic aliases they may use, and gives MQTT 3.1.1 clients refusals
// they can read (connect.go).
func (h *ingest) OnPacketEncode(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Connack && pk.ReasonCode < packets.ErrUnspecifiedError.Code {
		pk.Properties.MaximumPacketSize = h.srv.Options.Capabilities.MaximumPacketSize
		// mochi announces no Topic Alias Maximum, which a client must take
		// as 0 [MQTT-3.2.2-17]: the guard accepts this many (packetcheck.go).
		pk.Properties.TopicAliasMaximum = h.srv.Options.Capabilities.TopicAliasMaximum
	}
	if pk.FixedHeader.Type == packets.Connack {
		return connack(cl, pk)
	}
	return pk
}

// OnPublish takes over the publishes on captured topics that OnPacketRead
// left to mochi; mochi neither acks nor fans them out. Other topics pass
// through.
func (h *ingest) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return h.publishInline(cl, pk)
	}
	st, owned := h.owner(pk.TopicName)
	if !owned {
		if cc, ok := cl.Net.Conn.(*corkConn); ok && pk.FixedHeader.Qos > 0 {
			// mochi writes the PUBACK (PUBREC) before it fans the
			// publish out: a client that subscribes once the publisher
			// has its ack would get it live, though the broker had it
			// before the SUBSCRIBE [MQTT-4.5.0-1]. The ack waits in the
			// cork until OnPacketProcessed, after the fan-out.
			cc.cork()
			cc.ackHeld.Store(true)
		}
		return pk, nil
	}
	if err := h.routePublish(h.conn(cl), &pk, st); err != nil {
		// The client was disconnected (Receive Maximum). mochi's read loop
		// ends without an error on this path; OnDisconnect sends the will
		// of a captured topic from the stop cause.
		return pk, packets.ErrRejectPacket
	}
	if pk.FixedHeader.Qos == 0 {
		// Stored, and delivered from the log: mochi must not deliver it as
		// well. For QoS 0 Ignore says so, and mochi has nothing to ack;
		// ErrRejectPacket would say it too, but mochi's answer to it
		// copies the whole 800-byte packet into the arguments of a debug
		// log call whether or not debug is on (hooks.go:403).
		pk.Ignore = true
		return pk, nil
	}
	return pk, packets.ErrRejectPacket
}

// OnPacketProcessed sends the ack OnPublish held back, now that mochi
// fanned the publish out. It runs after every packet mochi processed,
// whatever the outcome: a later hook that rejected the publish (edge's
// $mirror/ hook) never reaches OnPublished, and the ack it wrote itself
// must not stay held.
func (h *ingest) OnPacketProcessed(cl *mochi.Client, pk packets.Packet, _ error) {
	if cc, ok := cl.Net.Conn.(*corkConn); ok && cc.ackHeld.Swap(false) {
		_ = cc.uncork() // a failed write ends the connection: mochi's read loop sees it
	}
}

// routePublish appends pk to st, the stream owner found for it, or, when st is nil
// (a topic of the replay protocol, or one too deep), commits a consumer group's offset or
// refuses the publish. Its answer, if any, comes from c's ack drainer.
//
// An MQTT 5 client may have at most Window QoS 1/2 publishes unanswered
// (its flows: QoS 2 ones until PUBREL), the Receive Maximum Peat
// announced; one more is a protocol error, answered with DISCONNECT 0x93
// and the error returned [MQTT-3.3.4-9]. MQTT 3.1.1 has no Receive
// Maximum: its clients wait for a window slot (TCP back-pressure).
func (h *ingest) routePublish(c *ingestConn, pk *packets.Packet, st Stream) error {
	if pk.FixedHeader.Qos > 0 && c.v5() && c.receiveFull() {
		h.m.Closed.WithLabelValues(ReasonReceiveMaximum).Inc()
		_ = h.srv.DisconnectClient(c.cl, packets.ErrReceiveMaximum)
		return packets.ErrReceiveMaximum
	}
	switch {
	case tooDeep(pk.TopicName, h.cfg.MaxTopicLevels):
		c.refuse(pk, codeTopicLevels(h.cfg.MaxTopicLevels), ReasonTopicLevels)
	case st != nil && isMirror(st):
		c.refuse(pk, codeMirror, ReasonMirror)
	case st != nil && len(pk.Payload) > h.cfg.MaxPayload:
		c.refuse(pk, h.tooBig, ReasonTooLarge)
	case st != nil:
		c.publish(st, pk)
	case strings.HasPrefix(pk.TopicName, offsetsPrefix):
		c.commitOffset(pk)
	default:
		c.refuse(pk, codeReserved, ReasonReadOnly)
	}
	return nil
}

// stream returns the named stream, or nil.
func (h *ingest) stream(name string) Stream { return h.log.Stream(name) }

// publishInline appends a publish made in process (mochi's inline client).
// mochi treats those as QoS 0; nothing is acked.
func (h *ingest) publishInline(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	st := h.log.Route(pk.TopicName)
	if st == nil || reservedTopic(pk.TopicName) || isMirror(st) {
		return pk, nil
	}
	rec := recordOf(cl.ID, &pk)
	st.AppendAsync([]*logstore.Record{rec}, func(_ uint64, err error) {
		h.appended(st, err)
	})
	return pk, packets.ErrRejectPacket
}

// appended is the common part of every append's completion. It runs on
// the log's appender goroutine: it only counts and logs a state change.
// Retained messages come from the committed log (retained.go).
func (h *ingest) appended(st Stream, err error) {
	name := st.Name()
	h.noteAppend(name, err)
	if err != nil {
		h.m.Refused.WithLabelValues(ReasonStoreFailed).Inc()
		return
	}
	h.m.Received.WithLabelValues(name).Inc()
}

// noteAppend logs a stream starting to fail, and recovering, once each,
// not once per message.
func (h *ingest) noteAppend(stream string, err error) {
	h.failMu.Lock()
	was := h.failing[stream]
	now := err != nil
	if was != now {
		if now {
			h.failing[stream] = true
		} else {
			delete(h.failing, stream)
		}
	}
	h.failMu.Unlock()
	switch {
	case now && !was:
		h.logger.Warn("appends failing: refusing publishes", slog.String(attrStream, stream), slog.Any(attrErr, err))
	case was && !now:
		h.logger.Info("appends succeed again", slog.String(attrStream, stream))
	}
}

// recordOf builds the log record of a publish.
func recordOf(clientID string, pk *packets.Packet) *logstore.Record {
	p := &pk.Properties
	r := &logstore.Record{
		Topic:           pk.TopicName,
		Payload:         pk.Payload,
		QoS:             pk.FixedHeader.Qos,
		Retain:          pk.FixedHeader.Retain,
		ClientID:        clientID,
		ContentType:     p.ContentType,
		ResponseTopic:   p.ResponseTopic,
		CorrelationData: p.CorrelationData,
		MessageExpiry:   p.MessageExpiryInterval, // counted from the record's timestamp
	}
	if p.PayloadFormatFlag {
		pf := p.PayloadFormat
		r.PayloadFormat = &pf
	}
	if len(p.User) > 0 {
		r.UserProperties = make([]logstore.UserProperty, len(p.User))
		for i, u := range p.User {
			r.UserProperties[i] = logstore.UserProperty{Key: u.Key, Value: u.Val}
		}
	}
	return r
}
