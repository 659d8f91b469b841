package mqtt

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
)

// guardConfig is what the guard listener enforces.
type guardConfig struct {
	connectTimeout time.Duration
	maxConnect     int    // bytes of a whole CONNECT
	maxPacket      int    // bytes of any other packet (the Maximum Packet Size)
	maxPending     int    // connections awaiting their CONNACK
	maxPendingSrc  int    // of them from one source (pending.go)
	topicAliases   uint16 // the Topic Alias Maximum announced to MQTT 5 clients
	// tls, when set, is served on each connection under the guard: the
	// deadline and the pending count cover the handshake, and the framing
	// checks read the decrypted packets.
	tls *tls.Config
	// ws, when set, makes this a WebSocket listener: each connection
	// (after TLS) must upgrade within the same deadline (wsconn.go).
	ws *wsConfig
}

// guardListener is Peat's mochi listener on a net.Listener, in place of
// mochi's listeners.Net. It accepts connections under a guard (guardConn):
// a connection must send its CONNECT within connectTimeout, a CONNECT may
// not announce more than maxConnect bytes (mochi allocates the announced
// size before reading), and at most maxPending connections may await
// their CONNACK (more are closed at once). It also logs how each
// connection ended, with a message, the remote address and the client id,
// at a level that fits the cause and rate-limited by cause (connlog.go);
// mochi's own listener logs every ended connection as a WARN with an
// empty message and the error alone.
type guardListener struct {
	ln   net.Listener
	id   string
	cfg  guardConfig
	m    *Metrics
	logs *connLog
	// afterPanic cleans up after a client whose read goroutine panicked
	// (Broker.afterPanic); nil in tests of the listener alone.
	afterPanic func(*guardConn, error)

	end  atomic.Bool
	done chan struct{} // closed by Close: stops the accept back-off
	mu   struct {
		sync.Mutex
		pending pendingSet // accepted, no CONNACK yet
	}
	wg        sync.WaitGroup // connection goroutines
	serving   atomic.Bool    // Serve has started (on mochi's goroutine)
	serveDone chan struct{}  // closed when Serve returns
}

var _ listeners.Listener = (*guardListener)(nil)

func newGuardListener(id string, ln net.Listener, cfg guardConfig, m *Metrics, logs *connLog) *guardListener {
	l := &guardListener{ln: ln, id: id, cfg: cfg, m: m, logs: logs,
		done: make(chan struct{}), serveDone: make(chan struct{})}
	l.mu.pending = newPendingSet(cfg.maxPending, cfg.maxPendingSrc)
	return l
}

// ID, Address and Protocol describe the listener to mochi.
func (l *guardListener) ID() string      { return l.id }
func (l *guardListener) Address() string { return l.ln.Addr().String() }
func (l *guardListener) Protocol() string {
	if l.cfg.ws != nil {
		return "ws"
	}
	return l.ln.Addr().Network()
}

// describe is the listener's protocol as a URL scheme, for log lines.
func (l *guardListener) describe() string {
	switch {
	case l.cfg.ws != nil && l.cfg.tls != nil:
		return "wss"
	case l.cfg.ws != nil:
		return "ws"
	case l.cfg.tls != nil:
		return "mqtts"
	}
	return "mqtt"
}

// Init is mochi's; the listener logs through its own connLog.
func (l *guardListener) Init(*slog.Logger) error { return nil }

// Serve accepts connections until Close, each served by establish on a
// goroutine of its own that the listener waits for (wait).
func (l *guardListener) Serve(establish listeners.EstablishFn) {
	if !l.serving.CompareAndSwap(false, true) {
		return
	}
	defer close(l.serveDone)
	backoff := time.Duration(0)
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			if l.end.Load() || !acceptRetryable(err) {
				return
			}
			// Out of file descriptors, say: mochi's listener returns and
			// never accepts again; wait and retry, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.logs.log(slog.LevelError, "accepting MQTT connections", "accept", slog.Any(attrErr, err))
			select {
			case <-time.After(backoff):
				continue
			case <-l.done:
				return
			}
		}
		backoff = 0
		gc, ok := l.admit(nc)
		if !ok {
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer l.catch(gc)
			if err := l.upgrade(gc); err != nil {
				_ = gc.Close()
				l.logs.ended(gc, err)
				return
			}
			err := establish(l.id, &corkConn{Conn: gc})
			l.logs.ended(gc, err)
		}()
	}
}

// catch, deferred on a connection's goroutine (the client's read
// goroutine, running mochi and every hook), recovers a panic there: it
// closes that connection alone (panics.go).
func (l *guardListener) catch(gc *guardConn) {
	r := recover()
	if r == nil {
		return
	}
	err := panics{m: l.m, logs: l.logs}.record(r, "read", gc.clientID, gc.RemoteAddr().String())
	_ = gc.Close()
	if l.afterPanic != nil {
		l.afterPanic(gc, err)
	}
	l.logs.ended(gc, err)
}

// acceptRetryable reports whether Accept may succeed again later.
func acceptRetryable(err error) bool {
	var ne net.Error
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.ECONNABORTED) || (errors.As(err, &ne) && ne.Timeout())
}

// admit puts nc under guard, or closes it when maxPending connections
// (or maxPendingSrc from its source) already await their CONNACK or the
// listener is closing.
func (l *guardListener) admit(nc net.Conn) (*guardConn, bool) {
	gc := &guardConn{Conn: nc, l: l, deadline: time.Now().Add(l.cfg.connectTimeout), src: pendingKey(nc.RemoteAddr())}
	if l.cfg.tls != nil {
		gc.tc = tls.Server(nc, l.cfg.tls) // handshakes on the first read, under nc's deadline
		gc.Conn = gc.tc
	}
	if l.cfg.ws != nil {
		gc.Conn = &wsConn{Conn: gc.Conn}
	}
	gc.fr.maxConnect, gc.fr.maxPacket = l.cfg.maxConnect, l.cfg.maxPacket
	gc.fr.aliases.max = l.cfg.topicAliases
	l.mu.Lock()
	closing := l.end.Load()
	full := ""
	if !closing {
		full = l.mu.pending.add(gc)
	}
	l.mu.Unlock()
	if full != "" {
		l.count(full)
		limit := l.cfg.maxPending
		if full == ReasonTooManyPendingFromAddress {
			limit = l.cfg.maxPendingSrc
		}
		l.logs.refusedPending(nc, full, limit)
	}
	if full != "" || closing {
		_ = nc.Close()
		return nil, false
	}
	_ = nc.SetReadDeadline(gc.deadline)
	return gc, true
}

// upgrade makes a connection to a WebSocket listener speak WebSocket,
// before mochi reads it; on other listeners it does nothing. A refusal
// is counted; the caller closes the connection and logs why.
func (l *guardListener) upgrade(gc *guardConn) error {
	wc, ok := gc.Conn.(*wsConn)
	if !ok {
		return nil
	}
	return wc.upgrade(l.cfg.ws, gc.deadline, l.count)
}

func (l *guardListener) leavePending(gc *guardConn) {
	l.mu.Lock()
	l.mu.pending.remove(gc)
	l.mu.Unlock()
}

// pending is the number of connections awaiting their CONNACK.
func (l *guardListener) pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.mu.pending.conns)
}

func (l *guardListener) count(reason string) { l.m.Closed.WithLabelValues(reason).Inc() }

// Close stops accepting, has mochi close its clients, and closes the
// connections that have no CONNACK yet (mochi does not know them as
// clients, and would wait for them).
func (l *guardListener) Close(closeClients listeners.CloseFn) {
	if !l.end.CompareAndSwap(false, true) {
		return
	}
	close(l.done)
	closeClients(l.id)
	_ = l.ln.Close()
	l.mu.Lock()
	pending := make([]*guardConn, 0, len(l.mu.pending.conns))
	for gc := range l.mu.pending.conns {
		pending = append(pending, gc)
	}
	l.mu.Unlock()
	for _, gc := range pending {
		_ = gc.Close()
	}
}

// wait waits, after Close, for Serve and the connection goroutines.
func (l *guardListener) wait() {
	if l.serving.Load() {
		<-l.serveDone
	}
	l.wg.Wait()
}
