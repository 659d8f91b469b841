package cluster

import (
	"context"
	"net"
	"sync"
)

// rpcConn is a connection for one request at a time: a follower's to a
// stream's leader (forwarded state writes, claims), a broker's to the
// controller (heartbeats). It is dialled again when the address changes
// or a request fails.
type rpcConn struct {
	mu   sync.Mutex
	addr string
	conn net.Conn
	buf  []byte
}

func (c *rpcConn) call(ctx context.Context, dial Dialer, addr string, kind byte, body []byte, want byte, resp decoder) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil && c.addr != addr {
		c.conn.Close()
		c.conn = nil
	}
	if c.conn == nil {
		conn, err := dial(ctx, addr)
		if err != nil {
			return err
		}
		c.conn, c.addr = conn, addr
	}
	conn := c.conn
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	fc := &fetchConn{conn: conn, wait: rpcTimeout, buf: c.buf}
	err := fc.roundTrip(kind, body, want, resp)
	c.buf = fc.buf
	if err != nil {
		c.conn.Close()
		c.conn = nil
	}
	return err
}

func (c *rpcConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}
