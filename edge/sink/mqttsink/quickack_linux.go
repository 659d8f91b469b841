package mqttsink

import (
	"net"
	"syscall"
)

// quickAckConn acknowledges at once (TCP_QUICKACK) what each read took.
//
// An upstream that leaves Nagle on (Mosquitto does, unless
// set_tcp_nodelay) holds each PUBACK after the first until its segment is
// acknowledged, and Linux delays that acknowledgement up to 40 ms while
// the sink, its window full, has nothing to send it with: the drain then
// ran at a window per 40 ms (430 records/s with Mosquitto's defaults).
// The kernel clears the flag by itself, so it is set again after every
// read.
type quickAckConn struct {
	net.Conn
	rc syscall.RawConn
}

// withQuickAck wraps a TCP connection; any other is returned as it is.
func withQuickAck(nc net.Conn) net.Conn {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nc
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nc
	}
	return &quickAckConn{Conn: nc, rc: rc}
}

func (c *quickAckConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		_ = c.rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
		})
	}
	return n, err
}
