package mqtt

import (
	"log/slog"
	"net"
	"net/netip"
)

// The per-address share of pending connections. The guard listener
// counts the connections awaiting their CONNACK by source, so that one
// host holding silent sockets cannot take every place of
// MaxPendingConnections: from one source at most MaxPendingPerAddress
// may be pending, more are closed at once (counted in Closed as
// ReasonTooManyPendingFromAddress). A source is an IPv4 address, or an
// IPv6 /64 (one host often has a whole /64 to pick from).

// pendingKey is the source a connection from a counts against.
func pendingKey(a net.Addr) netip.Prefix { return sourceKey(a.String()) }

// sourceKey is the source of the remote address remote (host:port).
func sourceKey(remote string) netip.Prefix {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.Prefix{} // not TCP (a test's pipe): one source
	}
	ip := ap.Addr().Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// pendingSet is the guard listener's pending connections, by source.
// Its owner (guardListener.mu) serialises access.
type pendingSet struct {
	conns  map[*guardConn]struct{}
	bySrc  map[netip.Prefix]int
	max    int // MaxPendingConnections
	maxSrc int // MaxPendingPerAddress
}

func newPendingSet(max, maxSrc int) pendingSet {
	return pendingSet{conns: map[*guardConn]struct{}{}, bySrc: map[netip.Prefix]int{}, max: max, maxSrc: maxSrc}
}

// add admits gc, or returns the reason it cannot be: too many pending in
// all, or from gc's source.
func (p *pendingSet) add(gc *guardConn) string {
	switch {
	case len(p.conns) >= p.max:
		return ReasonTooManyPending
	case p.bySrc[gc.src] >= p.maxSrc:
		return ReasonTooManyPendingFromAddress
	}
	p.conns[gc] = struct{}{}
	p.bySrc[gc.src]++
	return ""
}

func (p *pendingSet) remove(gc *guardConn) {
	if _, ok := p.conns[gc]; !ok {
		return
	}
	delete(p.conns, gc)
	if p.bySrc[gc.src]--; p.bySrc[gc.src] <= 0 {
		delete(p.bySrc, gc.src)
	}
}

// refusedPending logs a connection closed as soon as it was accepted,
// for reason (a pending limit).
func (l *connLog) refusedPending(nc net.Conn, reason string, limit int) {
	msg, err := "refusing connection: too many awaiting CONNACK", ErrTooManyPending
	if reason == ReasonTooManyPendingFromAddress {
		msg, err = "refusing connection: too many from its address awaiting CONNACK", ErrTooManyPendingFromAddress
	}
	l.log(slog.LevelWarn, msg, reason,
		slog.String(attrRemote, nc.RemoteAddr().String()), slog.Int(attrLimit, limit), slog.Any(attrErr, err))
}
