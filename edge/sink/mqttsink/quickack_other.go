//go:build !linux

package mqttsink

import "net"

// withQuickAck returns nc: TCP_QUICKACK is Linux's (quickack_linux.go).
func withQuickAck(nc net.Conn) net.Conn { return nc }
