package mqtt

import (
	"net"
	"sync"
	"sync/atomic"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// corkLimit is how many bytes a corked connection holds before it writes
// them anyway.
const corkLimit = 32 << 10

// corkConn is a client connection whose writes can be held back and sent
// together. mochi's WritePacket writes each packet to the socket at once
// (one syscall per packet) unless its own outbound channel has a backlog,
// which log-driven delivery and asynchronous acks never use. A writer with
// several packets ready (delivery's sender, the ack drainer) corks the
// connection, writes each one into the cork buffer, and uncorks to send them in one write. Writes
// while uncorked go straight through, so mochi's own packets are not
// delayed.
type corkConn struct {
	net.Conn
	// access is what the client may do, set when Auth accepted its
	// CONNECT (auth.go); nil before, and without Auth.
	access atomic.Pointer[accessBox]
	// willDenied: Auth let the client in, but not its will's topic.
	willDenied atomic.Bool
	// throttled: the login backoff refused the CONNECT unchecked (backoff.go).
	throttled atomic.Bool
	// refusal: Auth let the client in, but not with this client id
	// (tenancy.go); its CONNACK's code and reason string.
	refusal atomic.Pointer[packets.Code]
	// sessionEnded: the session this connection took over ended with the
	// connection it took over (sessions_takeover.go).
	sessionEnded atomic.Bool
	// ackHeld: corked until mochi has fanned out the client's publish on
	// a topic no stream captures (ingest's OnPublish, OnPacketProcessed).
	ackHeld atomic.Bool
	mu      struct {
		sync.Mutex
		corks int
		buf   []byte
		err   error // the first failed flush; later writes return it
	}
}

// Write sends p, or appends it to the cork buffer while corked.
func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.err != nil {
		return 0, c.mu.err
	}
	if c.mu.corks == 0 {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		return c.Conn.Write(p)
	}
	c.mu.buf = append(c.mu.buf, p...)
	if len(c.mu.buf) >= corkLimit {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// cork holds back writes until the matching uncork.
func (c *corkConn) cork() {
	c.mu.Lock()
	c.mu.corks++
	c.mu.Unlock()
}

// uncork ends one cork; the last one sends what was held back.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.corks--
	if c.mu.corks > 0 {
		return nil
	}
	err := c.flushLocked()
	if cap(c.mu.buf) > corkLimit*2 {
		c.mu.buf = nil // a burst's buffer is not kept by an idle client
	}
	return err
}

func (c *corkConn) flushLocked() error {
	if len(c.mu.buf) == 0 {
		return c.mu.err
	}
	_, err := c.Conn.Write(c.mu.buf)
	c.mu.buf = c.mu.buf[:0]
	if err != nil && c.mu.err == nil {
		c.mu.err = err
	}
	return c.mu.err
}

// corked runs fn with cl's connection corked, so the packets fn writes leave
// in as few writes as possible. Clients that did not come through a
// corkListener (inline or test connections) just run fn.
func corked(cl *mochi.Client, fn func()) error {
	cc, ok := cl.Net.Conn.(*corkConn)
	if !ok {
		fn()
		return nil
	}
	cc.cork()
	fn()
	return cc.uncork()
}
