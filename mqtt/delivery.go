package mqtt

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
)

// Log-driven delivery.
//
// Publishes to captured topics never reach mochi's fan-out: the ingest hook
// appends them to their stream and the delivery hook feeds subscribers from
// the log. The pieces, and who owns which goroutine:
//
//   - delivery (this file) is the mochi hook. It keeps one deliveryClient per
//     connected client that has at least one subscription, and one
//     deliveryReader per stream. Its hooks do bounded work inline: register
//     a client, note an acknowledgement, cancel a client.
//   - deliveryReader (delivery_reader.go) is the one shared reader of a
//     stream on this node. It waits on Changed, reads committed batches and,
//     for each record, matches it against mochi's topic index and offers it
//     without blocking to each matching live client's bounded queue.
//   - deliveryClient (delivery_client.go) has one sender goroutine that
//     writes the queued records to its client itself (never through mochi's
//     drop-when-full outbound channel), keeping a window of unacknowledged
//     QoS 1/2 messages.
//   - deliveryCursor (delivery_cursor.go) is a position in a stream, read
//     in bounded batches, that skips (and counts) what retention removed
//     below it: the shared reader, each catch-up cursor and each tap read
//     through one. deliveryClient.item builds what a client is sent for a
//     record, for all of them.
//   - catch-up (delivery_cursor.go): when a client's queue is full, the
//     client leaves the shared reader for that stream and a cursor
//     goroutine reads the log from the first offset it missed, matching for that client alone and waiting for room in its
//     queue, until it reaches the reader's position and rejoins it under the
//     reader's lock: no gap, no duplicate, and memory bounded by QueueDepth.
//     A $share group that cannot place a QoS 1/2 record does the same with
//     a group cursor; a QoS 0 record no member has room for is dropped and
//     counted. A client's cursor takes QoS 0 records too (a burst larger
//     than the queue loses nothing) and drops, counting each as slow_qos0,
//     those more than QoS0MaxLag behind the log's end, as they fall that
//     far behind, even while it waits for a subscriber that stopped reading.
//
// Lock order: delivery.mu, then deliveryReader.mu, then deliveryClient.mu;
// retainedSet.mu is taken under deliveryReader.mu (a snapshot's offset must
// be the reader's), never the other way.
// Queues are channels and are never sent to while blocking under a lock.

// delivery is the mochi hook that delivers records of captured topics from
// the log to subscribers.
type delivery struct {
	mochi.HookBase

	srv      *mochi.Server
	log      Log
	cfg      Config
	m        *Metrics
	logger   *slog.Logger
	panics   panics
	auth     Auth // nil: everyone reads everything; else every record is checked (auth.go)
	groups   *groups
	sessions *sessions
	state    *stateWriter
	retained *retainedSet // retained messages from the committed log (retained.go)
	orphans  orphanQueue  // sessions to adopt, in a site (sessions_orphans.go)

	// Drop counters, resolved once.
	dropSlowQoS0  prometheus.Counter
	dropRetention prometheus.Counter
	dropClosed    prometheus.Counter
	dropTooLarge  prometheus.Counter
	dropExpired   prometheus.Counter
	dropDenied    prometheus.Counter

	// taps counts the tap goroutines running: how many extension
	// subscriptions are being served (tests wait on it; a tap that outlives
	// its subscription would deliver records the client no longer wants).
	taps atomic.Int64

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup // readers, senders, cursors and taps
	stateDone chan struct{}  // closed when the state writer has written its last
	subs      *subIndex      // the connections' subscriptions (delivery_match.go)
	parent    *parentLevel   // what mochi's index misses of '#' (parentlevel.go)
	closed    sync.Once

	mu struct {
		sync.RWMutex
		clients map[*mochi.Client]*deliveryClient
		readers []*deliveryReader // in Log.Streams order, then as added
		byName  map[string]*deliveryReader
	}
}

// newDelivery creates the delivery hook and starts one reader per stream,
// once the consumer state of every stream is loaded (a stream whose state
// cannot be read fails it: its groups and sessions would silently start
// over). Register it with srv.AddHook(d, nil) after the ingest hook; stop
// it with Close, before srv.Close (Close unblocks senders stuck writing to
// clients that do not read, which would otherwise hold up mochi's
// shutdown).
//
// auth, when not nil, decides what each client may read (auth.go); gs
// are the consumer groups and ss the durable sessions (their properties
// loaded: their offsets come with each stream), whose state delivery's
// state writer stores.
func newDelivery(srv *mochi.Server, log Log, cfg Config, m *Metrics, logger *slog.Logger,
	auth Auth, gs *groups, ss *sessions) (*delivery, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	d := &delivery{
		srv: srv, log: log, cfg: cfg, m: m, logger: logger,
		panics: panics{m: m, logs: newConnLog(logger)},
		auth:   auth, groups: gs, sessions: ss,
		dropSlowQoS0:  m.Dropped.WithLabelValues(ReasonSlowQoS0),
		dropRetention: m.Dropped.WithLabelValues(ReasonOutOfRetain),
		dropClosed:    m.Dropped.WithLabelValues(ReasonClientClosed),
		dropTooLarge:  m.Dropped.WithLabelValues(ReasonTooLarge),
		dropExpired:   m.Dropped.WithLabelValues(ReasonExpired),
		dropDenied:    m.Dropped.WithLabelValues(ReasonNotAuthorized),
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.subs = newSubIndex()
	d.parent = newParentLevel(srv)
	d.mu.clients = map[*mochi.Client]*deliveryClient{}
	d.mu.byName = map[string]*deliveryReader{}
	d.retained = newRetainedSet(srv, log.State(), logger.With(slog.String(attrPart, "retained")))
	d.state = newStateWriter(log, stateInterval, logger, d.stateWritten)
	gs.w, ss.w = d.state, d.state
	if sh, ok := log.(SharedState); ok {
		ss.shared = sh.StreamStateShared()
	}
	if site, ok := log.(SiteSessions); ok {
		ss.site = site
		d.state.sessions = site.SessionState()
	}
	d.stateDone = make(chan struct{})
	go func() {
		defer close(d.stateDone)
		d.state.run(d.ctx)
	}()
	streams := log.Streams()
	moved := make([]<-chan struct{}, len(streams))
	for i, s := range streams {
		moved[i] = s.StateMoved() // before loading: a move meanwhile is not missed
		if err := d.loadState(s); err != nil {
			d.cancel()
			<-d.stateDone
			return nil, err
		}
	}
	if ss.site != nil {
		ss.site.OnSessionTaken(d.sessionTaken)
		d.startOrphans()
	}
	events, cancelWatch := log.WatchStreams()
	for i, s := range streams {
		d.startReader(s, moved[i])
	}
	d.wg.Add(1)
	go d.followStreams(events, cancelWatch) // delivery_streams.go
	return d, nil
}

// stateInterval is the longest a consumer's acknowledged progress waits
// before it is written to the store.
const stateInterval = 100 * time.Millisecond

// flushState writes what acknowledgements changed after Close stopped the
// state writer (clients stay connected until mochi closes them). Broker.Close
// calls it once the clients are gone.
func (d *delivery) flushState() { d.state.flush() }

// stateWritten routes the state writer's reports.
func (d *delivery) stateWritten(ref stateRef, val []byte) {
	if k, ok := groupKeyOf(ref); ok {
		d.groups.written(k, val)
	}
}

// ID names the hook.
func (d *delivery) ID() string { return "peat-delivery" }

// Provides reports the hook events delivery handles.
func (d *delivery) Provides(b byte) bool {
	switch b {
	case mochi.OnSubscribed, mochi.OnSessionEstablished, mochi.OnPacketRead, mochi.OnDisconnect,
		mochi.OnSubscribe, mochi.OnUnsubscribed, mochi.OnACLCheck,
		mochi.OnSessionEstablish, mochi.OnClientExpired, mochi.StoredClients, mochi.StoredSubscriptions,
		mochi.OnSelectSubscribers:
		return true
	}
	return false
}

// writes: OnPacketEncode and OnPacketSent run on a client's write
// goroutine (panics.go).
func (d *delivery) writes(b byte) bool { return b == mochi.OnPacketEncode || b == mochi.OnPacketSent }

// Stop is mochi's hook shutdown; it is Close.
func (d *delivery) Stop() error {
	d.Close()
	return nil
}

// Close stops every reader, sender and cursor and waits for them. A sender
// blocked writing to a client that does not read is unblocked by expiring
// that connection's write deadline. Close is idempotent.
func (d *delivery) Close() {
	d.closed.Do(func() {
		if d.sessions.site != nil {
			d.sessions.site.OnSessionTaken(nil)
			d.sessions.site.OnSessionsOrphaned(nil)
		}
		d.cancel()
		d.mu.Lock()
		clients := make([]*deliveryClient, 0, len(d.mu.clients))
		for _, c := range d.mu.clients {
			clients = append(clients, c)
		}
		d.mu.clients = map[*mochi.Client]*deliveryClient{}
		d.mu.Unlock()
		for _, c := range clients {
			c.stop()
			c.unblockWrite()
		}
		d.wg.Wait()
		<-d.stateDone
	})
}

// OnSessionEstablished switches off mochi's own send quota for the client
// and starts delivery for a client that inherited subscriptions from an
// earlier session.
//
// The send quota is off because mochi v2.7.9 takes its inflight map's read
// lock twice after every packet of a client with a quota
// (processPacket -> Inflight.NextImmediate -> GetAll): with a writer such as
// a delivery sender waiting in between, that client deadlocks. Delivery
// enforces the client's Receive Maximum itself (the window); what mochi still
// sends itself (topics no stream captures, and their retained messages)
// goes out without it, as it does for MQTT 3 clients.
func (d *delivery) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	cl.State.Inflight.ResetSendQuota(0)
	d.indexSession(cl) // delivery_match.go
	d.sessions.establish(cl)
	if cl.State.Subscriptions.Len() > 0 {
		if c := d.attach(cl); c != nil {
			d.resumeTaps(c)
		}
	}
}

// OnSessionEstablish hands a resumed session to the new connection, takes
// the connection's outbound topic aliases from mochi (topicalias.go), and
// stops delivery to an earlier connection of the same client id before
// mochi hands its session to the new one, forgetting that connection's
// unacknowledged deliveries: delivery sends them again from the log, in
// order.
func (d *delivery) OnSessionEstablish(cl *mochi.Client, _ packets.Packet) {
	if d.sessions.site != nil && !d.siteEstablish(cl) { // sessions_site.go
		d.refuseConnect(cl)
		return
	}
	old, ok := d.srv.Clients.Get(cl.ID)
	if ok {
		d.endTakenOver(cl, old) // sessions_takeover.go
	}
	d.sessions.claim(cl, d.ends)
	ownTopicAliases(cl)
	if !ok {
		return
	}
	if c := d.client(old); c != nil {
		c.stop()
		c.dropOutstanding()
	}
}

// OnClientExpired ends an expired session: its stored state, its cursor,
// and its subscriptions in mochi's index (which mochi leaves behind).
func (d *delivery) OnClientExpired(cl *mochi.Client) {
	d.m.SessionsExpired.Inc()
	d.sessions.expire(cl.ID)
	d.srv.UnsubscribeClient(cl)
}

// StoredClients gives mochi the durable sessions at start, so a client
// finds its session present after a restart.
func (d *delivery) StoredClients() ([]storage.Client, error) {
	clients, _ := d.sessions.stored()
	return clients, nil
}

// StoredSubscriptions gives mochi the durable sessions' subscriptions.
func (d *delivery) StoredSubscriptions() ([]storage.Subscription, error) {
	_, subs := d.sessions.stored()
	for _, sub := range subs {
		d.parent.track(sub.Client, sub.Filter)
	}
	return subs, nil
}

// OnSelectSubscribers adds the subscribers mochi's index misses at a
// filter's parent level (parentlevel.go).
func (d *delivery) OnSelectSubscribers(subs *mochi.Subscribers, pk packets.Packet) *mochi.Subscribers {
	return d.parent.selectSubscribers(subs, pk)
}

// OnSubscribed starts delivery for a client's first granted subscription. It
// runs before mochi writes the SUBACK; MQTT allows matching PUBLISHes to be
// sent before it. The client starts live at each stream's committed offset;
// a subscription that gets retained messages starts where its snapshot of
// them was taken (delivery_retained.go).
func (d *delivery) OnSubscribed(cl *mochi.Client, pk packets.Packet, reasonCodes []byte) {
	d.indexSubscribed(cl, pk, reasonCodes) // delivery_match.go
	if !cl.Net.Inline {
		for i, sub := range pk.Filters {
			if i < len(reasonCodes) && reasonCodes[i] < packets.ErrUnspecifiedError.Code {
				d.parent.track(cl.ID, sub.Filter)
			}
		}
	}
	if c := d.client(cl); c != nil {
		d.onSubscribedTaps(c, pk, reasonCodes)
	}
	if persistent(cl) {
		var granted []packets.Subscription
		for i, code := range reasonCodes {
			if code < packets.ErrUnspecifiedError.Code && i < len(pk.Filters) {
				granted = append(granted, pk.Filters[i])
			}
		}
		d.sessions.subscribed(cl.ID, granted, asksClients(pk.Properties.User))
	}
	for _, code := range reasonCodes {
		if code < packets.ErrUnspecifiedError.Code {
			d.attach(cl)
			break
		}
	}
	d.retainedSubscribed(cl, pk, reasonCodes) // delivery_retained.go
}

// OnPacketRead takes the client's answers to deliveries (PUBACK, PUBREC,
// PUBCOMP): those of Peat's deliveries end here, those of mochi's own get
// mochi's packet id back (packetid.go). A publish ingest took (isHandled)
// is no answer.
func (d *delivery) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if isHandled(&pk) {
		return pk, nil
	}
	switch pk.FixedHeader.Type {
	case packets.Puback, packets.Pubrec, packets.Pubcomp:
		if c := d.client(cl); c != nil {
			return c.handleAck(pk), nil
		}
	}
	return pk, nil
}

// OnDisconnect stops delivery to the client and writes its durable
// session, or ends it when the connection's session expiry is 0. Its
// goroutines exit on their own (the connection is closed); Close waits for
// them.
func (d *delivery) OnDisconnect(cl *mochi.Client, _ error, expire bool) {
	d.mu.Lock()
	c := d.mu.clients[cl]
	delete(d.mu.clients, cl)
	readers := d.mu.readers
	d.mu.Unlock()
	if c != nil {
		c.stop()
		// A persistent session's next connection gets these from the log,
		// from its first unacknowledged offset; mochi must not resend them
		// too.
		c.dropOutstanding()
		for _, r := range readers {
			r.leave(c)
		}
		c.countUnsent()
	}
	d.subs.removeConn(cl)
	d.sessions.disconnected(cl, expire)
}

// ends are the committed offsets of the streams delivery reads.
func (d *delivery) ends() map[string]uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	ends := make(map[string]uint64, len(d.mu.readers))
	for _, r := range d.mu.readers {
		ends[r.stream.Name()] = r.stream.Committed()
	}
	return ends
}

// client returns the delivery state of cl, or nil.
func (d *delivery) client(cl *mochi.Client) *deliveryClient {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.mu.clients[cl]
}

// attach creates the delivery state of cl, once, and joins it to every
// stream's reader live at that stream's committed offset. It returns the
// state, nil when the client or the delivery has gone.
func (d *delivery) attach(cl *mochi.Client) *deliveryClient {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.mu.clients[cl]; c != nil {
		return c
	}
	if d.ctx.Err() != nil || cl.Closed() {
		return nil
	}
	c := newDeliveryClient(d, cl)
	d.mu.clients[cl] = c
	d.wg.Add(1)
	go c.run()
	for _, r := range d.mu.readers {
		r.join(c)
	}
	return c
}

// maxQoS caps a delivery's QoS at the server's maximum.
func (d *delivery) maxQoS() byte {
	return d.srv.Options.Capabilities.MaximumQos
}

// addInflight and removeInflight keep mochi's $SYS inflight count right for
// the entries delivery puts into a client's inflight map.
func (d *delivery) addInflight(n int64) { atomic.AddInt64(&d.srv.Info.Inflight, n) }
