package mqtt

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// refusalWriteTimeout bounds writing the DISCONNECT (or CONNACK) that
// explains a refusal to a client that may not be reading.
const refusalWriteTimeout = time.Second

// guardConn is a client connection as the guard listener accepted it,
// under mochi's buffered reader (and Peat's corkConn). Until the CONNECT is
// read it holds a deadline; on every read it follows the packet framing
// (framer) and, when a packet must be refused, it hands mochi the packets
// before it, then tells an MQTT 5 client why (DISCONNECT with a reason
// code) and fails mochi's next read, so mochi closes the connection as it
// does after any read error (the will is sent).
//
// The read side (Read and the fields it uses) runs on the client's one
// read goroutine, which is also the goroutine that runs establish and
// mochi's OnConnect and OnDisconnect hooks; writes come from any goroutine.
type guardConn struct {
	net.Conn
	l *guardListener

	tc       *tls.Conn    // the TLS connection beneath, nil without TLS
	src      netip.Prefix // the source its pending place counts against (pending.go)
	deadline time.Time    // the connect deadline: CONNECT (and TLS, WebSocket) by then

	fr       framer
	deferred *refusal // refused packet mochi has not reached yet
	failed   error    // the refusal given to mochi; later reads repeat it

	clientID  string // set by connHook.OnConnect
	stopCause error  // mochi's stop cause, set by connHook.OnDisconnect

	connacked atomic.Bool // a CONNACK was written
	released  atomic.Bool // left the listener's pending set
}

// Read reads from the socket and checks what it read; see guardConn.
func (c *guardConn) Read(p []byte) (int, error) {
	if c.failed != nil {
		return 0, c.failed
	}
	if c.deferred != nil {
		// mochi asks for more: it has handled every packet before the
		// refused one.
		return 0, c.refuse(c.deferred)
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		wasDone := c.fr.connectDone()
		start, ref := c.fr.scan(p[:n])
		switch {
		case ref != nil && start > 0:
			c.deferred = ref
			return start, nil
		case ref != nil:
			return 0, c.refuse(ref)
		}
		if !wasDone && c.fr.connectDone() {
			// mochi sets its keepalive deadline once it has the CONNECT.
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
	}
	if err != nil && !c.fr.connectDone() && isTimeout(err) {
		c.l.count(ReasonConnectTimeout)
		c.failed = fmt.Errorf("%w (%v): %w", ErrConnectTimeout, c.l.cfg.connectTimeout, err)
		return n, c.failed
	}
	if c.tc != nil && err != nil && !errors.Is(err, io.EOF) && !c.tc.ConnectionState().HandshakeComplete {
		// A client that speaks no TLS, or a certificate that is missing or
		// not signed by client_ca_file.
		c.l.count(ReasonTLSHandshake)
		c.failed = fmt.Errorf("%w: %w", ErrTLSHandshake, err)
		return n, c.failed
	}
	return n, err
}

// refuse counts ref, tells an MQTT 5 client (a CONNACK before the
// CONNECT is accepted, a DISCONNECT after), and returns the error for
// mochi's read loop.
func (c *guardConn) refuse(ref *refusal) error {
	c.deferred = nil
	c.failed = ref.err
	c.l.count(ref.reason)
	if c.fr.version == 5 {
		typ := byte(packets.Disconnect)
		if !c.fr.connectDone() {
			typ = packets.Connack
		}
		if b, err := encodeRefusal(typ, ref.code); err == nil {
			_ = c.Conn.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
			_, _ = c.Conn.Write(b)
		}
	}
	return c.failed
}

// encodeRefusal encodes an MQTT 5 CONNACK or DISCONNECT carrying code and
// its reason string, with mochi's encoder.
func encodeRefusal(typ byte, code packets.Code) ([]byte, error) {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: typ},
		ProtocolVersion: 5,
		ReasonCode:      code.Code,
		Properties:      packets.Properties{ReasonString: code.Reason},
	}
	var buf bytes.Buffer
	var err error
	if typ == packets.Connack {
		err = pk.ConnackEncode(&buf)
	} else {
		err = pk.DisconnectEncode(&buf)
	}
	return buf.Bytes(), err
}

// Write writes p; the first CONNACK takes the connection out of the
// listener's pending set.
func (c *guardConn) Write(p []byte) (int, error) {
	if !c.connacked.Load() && len(p) > 0 && p[0]>>4 == packets.Connack {
		c.connacked.Store(true)
		c.leavePending()
	}
	return c.Conn.Write(p)
}

// Close closes the connection and takes it out of the pending set.
func (c *guardConn) Close() error {
	c.leavePending()
	return c.Conn.Close()
}

func (c *guardConn) leavePending() {
	if c.released.CompareAndSwap(false, true) {
		c.l.leavePending(c)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// guardOf returns the guardConn under a mochi client, or nil (inline and
// test clients have none).
func guardOf(cl *mochi.Client) *guardConn {
	cc, ok := cl.Net.Conn.(*corkConn)
	if !ok {
		return nil
	}
	gc, _ := cc.Conn.(*guardConn)
	return gc
}

// connHook tells each guardConn its client's id (for log lines) and how
// mochi stopped it. Both hooks run on the client's read goroutine.
type connHook struct {
	mochi.HookBase
}

func (h *connHook) ID() string { return "peat-conn" }

func (h *connHook) Provides(b byte) bool { return b == mochi.OnConnect || b == mochi.OnDisconnect }

func (h *connHook) OnConnect(cl *mochi.Client, _ packets.Packet) error {
	if gc := guardOf(cl); gc != nil {
		gc.clientID = cl.ID
	}
	return nil
}

func (h *connHook) OnDisconnect(cl *mochi.Client, _ error, _ bool) {
	if gc := guardOf(cl); gc != nil {
		gc.stopCause = cl.StopCause()
	}
}
