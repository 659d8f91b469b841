package cluster

import (
	"context"
	"net"
)

// Dialer opens a connection to a node's cluster address. Replication takes
// one, so that tests can run it over an in-process network that drops,
// delays and partitions (faultnet) instead of TCP.
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

// TCPDialer dials TCP.
func TCPDialer(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}
