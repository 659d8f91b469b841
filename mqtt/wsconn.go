package mqtt

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// wsMaxRequest bounds the HTTP upgrade request of a WebSocket connection,
// headers included (a browser's cookies for the site go with it).
const wsMaxRequest = 16 << 10

// wsSubprotocols are the WebSocket subprotocols a client may ask for:
// "mqtt" (MQTT 3.1.1 and 5), and "mqttv3.1" of older browser libraries.
var wsSubprotocols = []string{"mqtt", "mqttv3.1"}

// wsConfig is what a WebSocket listener checks in the upgrade.
type wsConfig struct {
	origins  []string // normalised (normalizeOrigin); "*" lets any in
	upgrader websocket.Upgrader
}

func newWSConfig(l Listener, bufferSize int) *wsConfig {
	c := &wsConfig{}
	for _, o := range l.AllowedOrigins {
		if n, err := normalizeOrigin(o); err == nil {
			c.origins = append(c.origins, n)
		}
	}
	c.upgrader = websocket.Upgrader{
		// Buffers of its own: gorilla would otherwise read the socket
		// through the bounded reader the request was read with.
		ReadBufferSize:  bufferSize,
		WriteBufferSize: bufferSize,
		Subprotocols:    wsSubprotocols,
		CheckOrigin:     func(*http.Request) bool { return true }, // checked before, with a reason of its own
	}
	return c
}

// originAllowed reports whether a browser page at origin may connect to
// a listener with TLS (wss) or without. A request without an Origin
// header does not come from a browser (which always sends one on a
// WebSocket upgrade), so the check, which protects browsers' users from
// other sites' pages, does not apply to it. Same origin is the scheme
// (https for wss, http for ws) and host:port.
func (c *wsConfig) originAllowed(r *http.Request, isTLS bool) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	if len(c.origins) == 0 { // same origin only
		scheme := "http"
		if isTLS {
			scheme = "https"
		}
		u, err := url.Parse(origin)
		return err == nil && strings.EqualFold(u.Scheme, scheme) && strings.EqualFold(u.Host, r.Host)
	}
	return slices.Contains(c.origins, "*") || slices.Contains(c.origins, strings.ToLower(origin))
}

// wsConn is MQTT over a WebSocket connection, as the net.Conn mochi reads
// and writes. It embeds the TCP or TLS connection beneath, for addresses,
// read deadlines and Close; ws is set by upgrade, before any Read or
// Write. MQTT packets may span WebSocket messages and a message may hold
// several packets (MQTT 5, 6.0): Read returns bytes as they come.
type wsConn struct {
	net.Conn
	ws  *websocket.Conn
	r   io.Reader // the message being read, nil between messages
	wmu sync.Mutex
	wdl atomic.Pointer[time.Time] // the write deadline, handed to gorilla under wmu
}

// Read reads the bytes of binary messages in order. A text message is a
// protocol error (MQTT 5, 6.0: the connection is closed); a close
// message ends the connection like an EOF.
func (c *wsConn) Read(p []byte) (int, error) {
	for {
		if c.r == nil {
			op, r, err := c.ws.NextReader()
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return 0, io.EOF
			}
			if err != nil {
				return 0, err
			}
			if op != websocket.BinaryMessage {
				return 0, fmt.Errorf("%w: a WebSocket text message", ErrMalformed)
			}
			c.r = r
		}
		n, err := c.r.Read(p)
		if errors.Is(err, io.EOF) {
			c.r, err = nil, nil
			if n == 0 {
				continue
			}
		}
		return n, err
	}
}

// Write sends p as one binary message. corkConn serialises mochi's and
// Peat's writers; the guard's refusals come from the read goroutine, so
// writes take a lock of their own too (gorilla allows one writer).
func (c *wsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if d := c.wdl.Load(); d != nil {
		_ = c.ws.SetWriteDeadline(*d)
	}
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// SetWriteDeadline sets the deadline on the connection, for a write under
// way, and keeps it for the next Write to hand to gorilla, which sets its
// own on the connection before every frame. mochi sets deadlines from the
// read goroutine while others write, and gorilla's setter is not safe
// for that.
func (c *wsConn) SetWriteDeadline(t time.Time) error {
	c.wdl.Store(&t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *wsConn) SetDeadline(t time.Time) error {
	if err := c.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetReadDeadline(t)
}

// upgrade reads the HTTP upgrade request under the connection's deadline
// (the guard's connect deadline), checks its origin, and answers 101, or
// counts the refusal (before the client can see it) and answers an HTTP
// error. On success the connection speaks WebSocket, and its read
// deadline is set to deadline again (gorilla clears it).
func (c *wsConn) upgrade(cfg *wsConfig, deadline time.Time, count func(reason string)) error {
	br := bufio.NewReaderSize(&io.LimitedReader{R: c.Conn, N: wsMaxRequest}, 4096)
	req, err := http.ReadRequest(br)
	if err != nil {
		reason, err := c.readFailed(err)
		if reason != "" {
			count(reason)
		}
		if reason == ReasonWebSocketHandshake {
			c.httpError(http.StatusBadRequest, "bad request")
		}
		return err
	}
	if _, isTLS := c.Conn.(*tls.Conn); !cfg.originAllowed(req, isTLS) {
		count(ReasonWebSocketOrigin)
		c.httpError(http.StatusForbidden, "origin not allowed")
		return fmt.Errorf("%w: %q", ErrWebSocketOrigin, req.Header.Get("Origin"))
	}
	var status int
	var why error
	up := cfg.upgrader
	up.Error = func(_ http.ResponseWriter, _ *http.Request, s int, e error) { status, why = s, e }
	ws, err := up.Upgrade(&hijackWriter{conn: c.Conn, br: br}, req, nil)
	if err != nil {
		count(ReasonWebSocketHandshake)
		if status != 0 {
			c.httpError(status, why.Error())
		}
		return fmt.Errorf("%w: %w", ErrWebSocketHandshake, err)
	}
	c.ws = ws
	_ = c.Conn.SetReadDeadline(deadline)
	return nil
}

// readFailed sorts out why the upgrade request could not be read.
func (c *wsConn) readFailed(err error) (string, error) {
	tc, isTLS := c.Conn.(*tls.Conn)
	switch {
	case isTimeout(err):
		return ReasonConnectTimeout, fmt.Errorf("%w: %w", ErrConnectTimeout, err)
	case isTLS && !errors.Is(err, io.EOF) && !tc.ConnectionState().HandshakeComplete:
		return ReasonTLSHandshake, fmt.Errorf("%w: %w", ErrTLSHandshake, err)
	case errors.Is(err, io.EOF):
		return "", err // gone before asking anything: not a refusal
	}
	return ReasonWebSocketHandshake, fmt.Errorf("%w: %w", ErrWebSocketHandshake, err)
}

// httpError answers the upgrade request with status and msg, and closes.
func (c *wsConn) httpError(status int, msg string) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
	_, _ = fmt.Fprintf(c.Conn, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"Sec-WebSocket-Version: 13\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s\n",
		status, http.StatusText(status), len(msg)+1, msg)
}

// hijackWriter is the http.ResponseWriter gorilla's Upgrader needs for a
// connection that no http.Server owns: it only hijacks (errors are
// written by upgrade).
type hijackWriter struct {
	conn net.Conn
	br   *bufio.Reader
	h    http.Header
}

var _ http.Hijacker = (*hijackWriter)(nil)

func (w *hijackWriter) Header() http.Header {
	if w.h == nil {
		w.h = http.Header{}
	}
	return w.h
}

func (w *hijackWriter) Write([]byte) (int, error) { return 0, http.ErrHijacked }
func (w *hijackWriter) WriteHeader(int)           {}

func (w *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return w.conn, bufio.NewReadWriter(w.br, bufio.NewWriter(w.conn)), nil
}
