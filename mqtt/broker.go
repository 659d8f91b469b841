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

	mu struct {
		sync.Mutex
		ln      net.Listener   // nil until Start
		gl      *guardListener // mochi's listener on ln
		started bool
		closed  bool
	}
	closeOnce sync.Once
	closeErr  error
}

// New builds a broker on log: a mochi server with Peat's hooks, capabilities
// sized by cfg, and (once started) one TCP listener on cfg.Listen. An empty
// cfg.Listen means no listener (clients can still be attached through
// Server(), as tests do).
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
	if err := ss.load(log.State()); err != nil {
		return nil, fmt.Errorf("load durable sessions: %w", err)
	}
	conns := newConnLog(logger.With(slog.String(attrPart, "conn")))
	var ah mochi.Hook = new(auth.AllowHook)
	if cfg.Auth != nil {
		ah = &authHook{auth: cfg.Auth, m: m, logs: conns}
	}
	b := &Broker{
		cfg:    cfg,
		srv:    srv,
		logger: logger,
		m:      m,
		conns:  conns,
		ingest: newIngest(srv, log, cfg, m, logger, ah, gs),
	}
	if err := srv.AddHook(new(connHook), nil); err != nil {
		return nil, fmt.Errorf("add connection hook: %w", err)
	}
	if err := srv.AddHook(ah, nil); err != nil {
		return nil, fmt.Errorf("add auth hook: %w", err)
	}
	if err := srv.AddHook(b.ingest, nil); err != nil {
		return nil, fmt.Errorf("add ingest hook: %w", err)
	}
	deliv, err := newDelivery(srv, log, cfg, m, logger, cfg.Auth, gs, ss)
	if err != nil {
		return nil, err
	}
	b.deliv = deliv
	b.ingest.retained = b.deliv.retained
	if err := srv.AddHook(b.deliv, nil); err != nil {
		b.deliv.Close()
		return nil, fmt.Errorf("add delivery hook: %w", err)
	}
	return b, nil
}

// Start binds the listener and starts serving; it returns once the listener
// is bound.
func (b *Broker) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.mu.closed:
		return ErrClosed
	case b.mu.started:
		return ErrStarted
	}
	if b.cfg.Listen != "" {
		ln, err := net.Listen("tcp", b.cfg.Listen)
		if err != nil {
			return fmt.Errorf("mqtt listen on %s: %w", b.cfg.Listen, err)
		}
		gl := newGuardListener("tcp", ln, guardConfig{
			connectTimeout: b.cfg.ConnectTimeout,
			maxConnect:     b.cfg.MaxConnectSize,
			maxPacket:      int(b.srv.Options.Capabilities.MaximumPacketSize),
			maxPending:     b.cfg.MaxPendingConnections,
			tls:            b.cfg.TLS,
		}, b.m, b.conns)
		if err := b.srv.AddListener(gl); err != nil {
			_ = ln.Close()
			return fmt.Errorf("mqtt add listener %s: %w", b.cfg.Listen, err)
		}
		b.mu.ln, b.mu.gl = ln, gl
	}
	if err := b.srv.Serve(); err != nil {
		return fmt.Errorf("mqtt serve: %w", err)
	}
	b.mu.started = true
	if b.mu.ln != nil {
		b.logger.Info("mqtt listening", slog.String(attrAddr, b.mu.ln.Addr().String()))
	}
	return nil
}

// Addr is the bound listener address, nil before Start or without a
// listener.
func (b *Broker) Addr() net.Addr {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.ln == nil {
		return nil
	}
	return b.mu.ln.Addr()
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
		gl := b.mu.gl
		b.mu.Unlock()
		clientsDone := make(chan struct{})
		go func() { // ends when mochi has closed and the last client goroutine has ended
			_ = b.srv.Close()
			b.srv.Listeners.ClientsWg.Wait()
			if gl != nil {
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
