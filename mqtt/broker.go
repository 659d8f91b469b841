package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
)

// sysTopicInterval is how often, in seconds, mochi refreshes $SYS topics.
// Each refresh calls runtime.ReadMemStats (a stop-the-world); mochi's
// default is every second.
const sysTopicInterval = 60

// packetHeadroom is what an MQTT packet may carry besides its payload
// (fixed header, topic, properties) before mochi itself refuses it by size.
const packetHeadroom = 64 << 10

// maxPacketSize is the MQTT 5 Maximum Packet Size Peat enforces and
// advertises: payloads up to max_payload, plus room for topic and
// properties. A payload between max_payload and this is refused with a
// reason; a packet above it makes mochi disconnect the client while reading.
func maxPacketSize(maxPayload int) uint32 {
	const mqttMax = 268435455 + 5 // largest remaining length plus fixed header
	n := int64(maxPayload) + packetHeadroom
	if n > mqttMax {
		n = mqttMax
	}
	return uint32(n)
}

// Broker is the MQTT front-end of one node: a mochi server whose hooks store
// publishes on captured topics in the log and deliver subscribers from it.
type Broker struct {
	cfg    Config
	srv    *mochi.Server
	ingest *ingest
	deliv  *delivery
	logger *slog.Logger
	m      *Metrics
	conns  *connLog // connection log lines, rate-limited
	panics panics
	hooks  []mochi.Hook // Peat's, in the order added to mochi (afterPanic)
	// closing is closed when Close begins: logins waiting out the
	// backoff (backoff.go) stop waiting.
	closing chan struct{}

	mu struct {
		sync.Mutex
		listeners []*guardListener // bound by Start, in Config.listeners order
		started   bool
		closed    bool
	}
	closeOnce sync.Once
	closeErr  error
}

// New builds a broker on log: a mochi server with Peat's hooks, capabilities
// sized by cfg, and (once started) its listeners: cfg.Listen's, then
// cfg.Listeners. With none, clients can still be attached through
// Server(), as tests do.
func New(cfg Config, log Log) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if log == nil {
		return nil, fmt.Errorf("%w: log is nil", ErrInvalidConfig)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}

	caps := mochi.NewDefaultServerCapabilities()
	caps.ReceiveMaximum = uint16(cfg.Window) // inbound window, advertised to v5 clients
	caps.MaximumClientWritesPending = int32(cfg.WritesPending)
	caps.MaximumMessageExpiryInterval = 0 // otherwise mochi deletes retained and inflight messages after 24 h
	caps.MaximumPacketSize = maxPacketSize(cfg.MaxPayload)
	// mochi keeps each inbound alias's topic for the connection's life:
	// announcing 65,535 would let one client hold 65,535 topic names.
	caps.TopicAliasMaximum = uint16(cfg.TopicAliases)

	srv := mochi.New(&mochi.Options{
		Capabilities:             caps,
		ClientNetReadBufferSize:  cfg.BufferSize,
		ClientNetWriteBufferSize: cfg.BufferSize,
		Logger: slog.New(mochiLogHandler{
			Handler: logger.With(slog.String(attrPart, "mochi")).Handler(),
			limit:   newRateLimit(connLogBurst, connLogInterval),
		}),
		SysTopicResendInterval: sysTopicInterval,
		InlineClient:           true, // lets the node publish and subscribe in process
	})

	if err := migrateState(log, logger); err != nil {
		return nil, err
	}
	gs := newGroups()
	ss := newSessions()
	if _, site := log.(SiteSessions); !site { // a site's are read at connect (sessions_site.go)
		if err := ss.load(log.State()); err != nil {
			return nil, fmt.Errorf("load durable sessions: %w", err)
		}
	}
	conns := newConnLog(logger.With(slog.String(attrPart, "conn")))
	closing := make(chan struct{})
	var ah mochi.Hook = new(auth.AllowHook)
	if cfg.Auth != nil {
		ah = &authHook{auth: cfg.Auth, m: m, logs: conns, ten: &tenancy{srv: srv, ss: ss}, done: closing,
			backoff: newLoginBackoff(cfg.LoginBackoff, cfg.MaxLoginBackoff)}
	}
	b := &Broker{
		closing: closing,
		cfg:     cfg,
		srv:     srv,
		logger:  logger,
		m:       m,
		conns:   conns,
		panics:  panics{m: m, logs: conns},
		ingest:  newIngest(srv, log, cfg, m, logger, ah, gs),
	}
	b.ingest.panics = b.panics
	if err := b.addHook(new(connHook), "connection"); err != nil {
		return nil, err
	}
	if err := b.addHook(ah, "auth"); err != nil {
		return nil, err
	}
	if err := b.addHook(b.ingest, "ingest"); err != nil {
		return nil, err
	}
	if cfg.Auth != nil {
		if err := b.addHook(&revokeHook{b: b}, "revoke"); err != nil {
			return nil, err
		}
	}
	if cfg.beforeDelivery != nil {
		if err := b.addHook(cfg.beforeDelivery, "test"); err != nil {
			return nil, err
		}
	}
	deliv, err := newDelivery(srv, log, cfg, m, logger, cfg.Auth, gs, ss)
	if err != nil {
		return nil, err
	}
	b.deliv = deliv
	b.deliv.panics = b.panics
	if err := b.addHook(b.deliv, "delivery"); err != nil {
		b.deliv.Close()
		return nil, err
	}
	return b, nil
}

// addHook adds h to mochi's hooks, and its work on a client's write
// goroutine, if it is a writer, behind a recover (panics.go); and h to
// b.hooks. A hook that provides a write-goroutine event itself is
// refused: its panics there would end the process.
func (b *Broker) addHook(h mochi.Hook, name string) error {
	if h.Provides(mochi.OnPacketEncode) || h.Provides(mochi.OnPacketSent) {
		return fmt.Errorf("add %s hook: it provides OnPacketEncode or OnPacketSent, which run on a client's write goroutine: name them in writes (panics.go)", name)
	}
	if err := b.srv.AddHook(h, nil); err != nil {
		return fmt.Errorf("add %s hook: %w", name, err)
	}
	if w, ok := h.(writer); ok {
		if err := b.srv.AddHook(&writeSide{h: w, p: b.panics}, nil); err != nil {
			return fmt.Errorf("add %s hook: %w", name, err)
		}
	}
	b.hooks = append(b.hooks, h)
	return nil
}

// Start binds the listeners and starts serving; it returns once every
// listener is bound, or none (an address in use fails the whole start).
func (b *Broker) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.mu.closed:
		return ErrClosed
	case b.mu.started:
		return ErrStarted
	}
	for _, l := range b.cfg.listeners() {
		gl, err := b.bind(l)
		if err != nil {
			b.closeUnserved()
			return err
		}
		b.mu.listeners = append(b.mu.listeners, gl)
	}
	for _, gl := range b.mu.listeners {
		if err := b.srv.AddListener(gl); err != nil {
			b.closeUnserved()
			return fmt.Errorf("mqtt add listener %s: %w", gl.id, err)
		}
	}
	if err := b.srv.Serve(); err != nil {
		return fmt.Errorf("mqtt serve: %w", err)
	}
	b.mu.started = true
	for _, gl := range b.mu.listeners {
		b.logger.Info("mqtt listening", slog.String(attrListener, gl.id), slog.String(attrProtocol, gl.describe()),
			slog.String(attrAddr, gl.ln.Addr().String()))
	}
	return nil
}

// bind binds l's address and puts the connection guard on it.
func (b *Broker) bind(l Listener) (*guardListener, error) {
	ln, err := net.Listen("tcp", l.Listen)
	if err != nil {
		return nil, fmt.Errorf("mqtt listen on %s (listener %s): %w", l.Listen, l.Name, err)
	}
	gc := guardConfig{
		connectTimeout: b.cfg.ConnectTimeout,
		maxConnect:     b.cfg.MaxConnectSize,
		maxPacket:      int(b.srv.Options.Capabilities.MaximumPacketSize),
		maxPending:     b.cfg.MaxPendingConnections,
		maxPendingSrc:  b.cfg.MaxPendingPerAddress,
		topicAliases:   b.srv.Options.Capabilities.TopicAliasMaximum,
		tls:            l.TLS,
	}
	if l.websocket() {
		gc.ws = newWSConfig(l, b.cfg.BufferSize)
	}
	gl := newGuardListener(l.Name, ln, gc, b.m, b.conns)
	gl.afterPanic = b.afterPanic
	return gl, nil
}

// closeUnserved closes the bound listeners after a failed Start; mochi
// never served them.
func (b *Broker) closeUnserved() {
	for _, gl := range b.mu.listeners {
		_ = gl.ln.Close()
	}
	b.mu.listeners = nil
}

// Addr is the address of the first listener, nil before Start or
// without a listener.
func (b *Broker) Addr() net.Addr {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.mu.listeners) == 0 {
		return nil
	}
	return b.mu.listeners[0].ln.Addr()
}

// ListenerAddr is the bound address of the listener named name, nil
// before Start or when there is none.
func (b *Broker) ListenerAddr(name string) net.Addr {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, gl := range b.mu.listeners {
		if gl.id == name {
			return gl.ln.Addr()
		}
	}
	return nil
}

// Server is the mochi server, for tests and the delivery hook.
func (b *Broker) Server() *mochi.Server { return b.srv }

// Clients is the number of connected clients.
func (b *Broker) Clients() int {
	return int(atomic.LoadInt64(&b.srv.Info.ClientsConnected))
}

// Close stops accepting connections, disconnects clients, stops the hooks
// and waits for their goroutines, or until ctx is done. Appends already
// handed to the log complete on the log's side; their acks are not sent.
// Close is idempotent.
func (b *Broker) Close(ctx context.Context) error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.mu.closed = true
		b.mu.Unlock()
		close(b.closing)

		// Delivery first: its senders may be blocked writing to clients that
		// do not read, which would hold up mochi's disconnects. Then ingest:
		// publishers blocked on a full window give up, and wills stop firing.
		b.deliv.Close()
		b.ingest.beginClose()
		// srv.Close closes the listener, disconnects clients and stops hooks.
		// mochi v2.7.9 can deadlock in it: Clients.GetByListener takes the
		// clients map's read lock twice, and a client removing itself in
		// between (a writer waiting on the lock) blocks both (seen in tests,
		// about one close in a hundred). So the connected clients are
		// disconnected and waited for first, leaving srv.Close nobody to
		// race with but a client connecting meanwhile; and srv.Close is
		// waited for no longer than ctx allows, like the client goroutines.
		b.disconnectClients(ctx)
		b.mu.Lock()
		gls := b.mu.listeners
		b.mu.Unlock()
		clientsDone := make(chan struct{})
		go func() { // ends when mochi has closed and the last client goroutine has ended
			_ = b.srv.Close()
			b.srv.Listeners.ClientsWg.Wait()
			for _, gl := range gls {
				gl.wait()
			}
			close(clientsDone)
		}()
		var errs []error
		select {
		case <-clientsDone:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("mqtt close: waiting for clients: %w", ctx.Err()))
		}
		b.ingest.wait()
		b.deliv.flushState()
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

// disconnectClients sends every connected client a DISCONNECT (server
// shutting down), closes its connection, and waits until none is connected
// or ctx ends.
func (b *Broker) disconnectClients(ctx context.Context) {
	for _, cl := range b.srv.Clients.GetAll() {
		if !cl.Closed() && !cl.Net.Inline {
			_ = b.srv.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
	for atomic.LoadInt64(&b.srv.Info.ClientsConnected) > 0 {
		if !deliverySleep(ctx, 5*time.Millisecond) {
			return
		}
	}
}
