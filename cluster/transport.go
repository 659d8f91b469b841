package cluster

import (
	"context"
	"net"
	"time"
)

// Dialer opens a connection to a node's cluster address. Replication takes
// one, so that tests can run it over an in-process network that drops,
// delays and partitions (faultnet) instead of TCP.
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

// dialTimeout bounds a TCP dial to another node: on a LAN a connection
// is made in milliseconds, and one not made in 2 s is behind a dead link.
// Giving up and dialling again sends a fresh SYN at once, where the
// kernel's retransmits of the first back off (1, 3, 7, 15 s...) and
// would leave a node that is back from a partition unreached for many
// seconds after the heal.
const dialTimeout = 2 * time.Second

// TCPDialer dials TCP, for at most dialTimeout.
func TCPDialer(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: dialTimeout}
	return d.DialContext(ctx, "tcp", addr)
}
