package mqtt

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Connection log lines of one cause are limited to connLogBurst per
// connLogInterval; the next line logged after a pause says how many were
// left out (attribute "suppressed"). Every refusal is also counted in
// peat_mqtt_closed_connections_total, so the limit hides no count.
const (
	connLogBurst    = 5
	connLogInterval = 10 * time.Second
)

// rateLimit lets at most burst events per key through per interval, and
// counts the others.
type rateLimit struct {
	burst    int
	interval time.Duration
	now      func() time.Time
	mu       struct {
		sync.Mutex
		keys map[string]*rateWindow // keys are a fixed set of causes and mochi messages
	}
}

type rateWindow struct {
	start      time.Time
	n          int // events let through since start
	suppressed int // events held back since the last one let through
}

func newRateLimit(burst int, interval time.Duration) *rateLimit {
	r := &rateLimit{burst: burst, interval: interval, now: time.Now}
	r.mu.keys = map[string]*rateWindow{}
	return r
}

// allow reports whether an event for key may pass now and, if so, how many
// were held back since the last one that passed.
func (r *rateLimit) allow(key string) (ok bool, suppressed int) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.mu.keys[key]
	if w == nil {
		w = &rateWindow{start: now}
		r.mu.keys[key] = w
	}
	if now.Sub(w.start) >= r.interval {
		w.start, w.n = now, 0
	}
	if w.n >= r.burst {
		w.suppressed++
		return false, 0
	}
	w.n++
	suppressed, w.suppressed = w.suppressed, 0
	return true, suppressed
}

// connLog writes the broker's connection log lines, rate-limited by cause.
type connLog struct {
	logger *slog.Logger
	limit  *rateLimit
}

func newConnLog(logger *slog.Logger) *connLog {
	return &connLog{logger: logger, limit: newRateLimit(connLogBurst, connLogInterval)}
}

// log writes one line for cause key, unless the limit holds it back.
func (l *connLog) log(level slog.Level, msg, key string, attrs ...slog.Attr) {
	ctx := context.Background()
	if !l.logger.Enabled(ctx, level) {
		return // a line nobody reads does not use up the limit
	}
	ok, suppressed := l.limit.allow(key)
	if !ok {
		return
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int(attrSuppressed, suppressed))
	}
	l.logger.LogAttrs(ctx, level, msg, attrs...)
}

// denied logs a refusal of Auth's: a CONNECT with bad credentials, a
// publish or a subscription the ACL does not allow. The rate-limit key is
// the kind of refusal, so a storm of one kind cannot hide another.
func (l *connLog) denied(kind, clientID, remote string, attrs ...slog.Attr) {
	attrs = append([]slog.Attr{slog.String(attrClient, clientID), slog.String(attrRemote, remote)}, attrs...)
	l.log(slog.LevelWarn, "not authorized: "+kind, "denied_"+kind, attrs...)
}

// ended logs how a connection ended: err is what mochi's establish
// returned for it.
func (l *connLog) ended(gc *guardConn, err error) {
	level, msg, key := connEnd(err, gc.stopCause, gc.connacked.Load())
	attrs := make([]slog.Attr, 0, 4)
	attrs = append(attrs, slog.String(attrRemote, gc.RemoteAddr().String()))
	if gc.clientID != "" {
		attrs = append(attrs, slog.String(attrClient, gc.clientID))
	}
	if err != nil {
		attrs = append(attrs, slog.Any(attrErr, err))
	} else if gc.stopCause != nil {
		attrs = append(attrs, slog.Any(attrErr, gc.stopCause))
	}
	l.log(level, msg, key, attrs...)
}

// connEnd picks the level, message and rate-limit key of a connection's
// end. err is establish's error, cause mochi's stop cause, connacked
// whether the client got its CONNACK. A client that goes away or lets its
// keepalive lapse is an event (INFO), not a warning; WARN is for what a
// client did wrong or was refused.
func connEnd(err, cause error, connacked bool) (slog.Level, string, string) {
	verb := "disconnected client: "
	if !connacked {
		verb = "refused connection: "
	}
	if (err == nil || errors.Is(err, net.ErrClosed) || errors.Is(err, packets.ErrRejectPacket)) && cause != nil {
		var code packets.Code
		if errors.As(cause, &code) {
			err = code // the server closed it: say why
		}
	}
	var code packets.Code
	switch {
	case err == nil:
		return slog.LevelDebug, "client disconnected", "disconnect"
	case errors.Is(err, ErrConnectTimeout):
		return slog.LevelInfo, "closed connection: no CONNECT in time", ReasonConnectTimeout
	case errors.Is(err, ErrTLSHandshake):
		return slog.LevelWarn, verb + "TLS handshake failed", ReasonTLSHandshake
	case errors.Is(err, ErrWebSocketOrigin):
		return slog.LevelWarn, "refused WebSocket connection: origin not allowed", ReasonWebSocketOrigin
	case errors.Is(err, ErrWebSocketHandshake):
		return slog.LevelWarn, "refused WebSocket connection: no WebSocket upgrade", ReasonWebSocketHandshake
	case errors.Is(err, ErrConnectTooLarge):
		return slog.LevelWarn, verb + "CONNECT too large", ReasonConnectTooLarge
	case errors.Is(err, ErrPacketTooLarge):
		return slog.LevelWarn, verb + "packet too large", ReasonPacketTooLarge
	case errors.Is(err, ErrTopicInvalid):
		return slog.LevelWarn, verb + "wildcard in a PUBLISH topic", ReasonTopicInvalid
	case errors.Is(err, ErrMalformed):
		return slog.LevelWarn, verb + "malformed packet", ReasonMalformed
	case errors.As(err, &code):
		return codeEnd(code, verb)
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, net.ErrClosed):
		if !connacked {
			return slog.LevelDebug, "connection closed before CONNACK", "closed_early"
		}
		return slog.LevelInfo, "client connection lost (no DISCONNECT)", "lost"
	case isTimeout(err):
		return slog.LevelInfo, "client keepalive expired", "keepalive"
	}
	return slog.LevelWarn, verb + "connection error", "error"
}

// codeEnd is connEnd for an MQTT reason code.
func codeEnd(code packets.Code, verb string) (slog.Level, string, string) {
	switch code.Code {
	case packets.ErrSessionTakenOver.Code:
		return slog.LevelInfo, "connection closed: session taken over by a new connection", "taken_over"
	case packets.ErrServerShuttingDown.Code:
		return slog.LevelDebug, "connection closed: server shutting down", "shutdown"
	case packets.ErrReceiveMaximum.Code:
		return slog.LevelWarn, verb + "receive maximum exceeded", ReasonReceiveMaximum
	case packets.ErrBadUsernameOrPassword.Code, packets.ErrNotAuthorized.Code:
		// The refusal itself was logged when Auth refused (connLog.denied).
		return slog.LevelDebug, verb + "not authorized", "not_authorized"
	case packets.ErrServerBusy.Code:
		return slog.LevelWarn, verb + "server busy", "busy"
	}
	if code.Code >= packets.ErrUnspecifiedError.Code {
		return slog.LevelWarn, verb + code.Reason, "protocol_error"
	}
	return slog.LevelDebug, "client disconnected", "disconnect"
}

// mochiLogHandler is the slog handler under mochi's logger. mochi logs
// every packet error as WARN "error processing packet" (with the whole
// packet, without the remote address) before the connection ends, and its
// listeners log an ended connection as WARN with an empty message; the
// guard listener logs each connection's end itself (connLog.ended), so
// the first is lowered to DEBUG, an empty message gets one, and WARN and
// ERROR lines are rate-limited by message.
type mochiLogHandler struct {
	slog.Handler
	limit *rateLimit
}

// Handle adjusts r as described on mochiLogHandler and passes it on.
func (h mochiLogHandler) Handle(ctx context.Context, r slog.Record) error {
	switch r.Message {
	case "error processing packet":
		r.Level = slog.LevelDebug
	case "":
		r.Message = "mochi: connection ended"
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	if r.Level >= slog.LevelWarn {
		ok, suppressed := h.limit.allow(r.Message)
		if !ok {
			return nil
		}
		if suppressed > 0 {
			r.AddAttrs(slog.Int(attrSuppressed, suppressed))
		}
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs and WithGroup keep the wrapper around the derived handler.
func (h mochiLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return mochiLogHandler{Handler: h.Handler.WithAttrs(as), limit: h.limit}
}

func (h mochiLogHandler) WithGroup(name string) slog.Handler {
	return mochiLogHandler{Handler: h.Handler.WithGroup(name), limit: h.limit}
}
