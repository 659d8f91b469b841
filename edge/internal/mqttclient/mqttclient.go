package mqttclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// SessionExpiry is the MQTT 5 Session Expiry Interval a persistent
// session asks for (one day): the upstream keeps the session across a
// reconnect.
const SessionExpiry = 24 * 60 * 60

// ParseURL checks an upstream URL; it returns host:port and whether TLS
// is on.
func ParseURL(raw string) (addr string, useTLS bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false, fmt.Errorf("%q is not a URL", raw)
	}
	port := ""
	switch u.Scheme {
	case "mqtt", "tcp":
		port = "1883"
	case "mqtts", "ssl", "tls":
		port, useTLS = "8883", true
	default:
		return "", false, fmt.Errorf("%q: scheme must be mqtt:// or mqtts://", raw)
	}
	if u.Hostname() == "" {
		return "", false, fmt.Errorf("%q: no host", raw)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil {
		return "", false, fmt.Errorf("%q: only scheme://host:port (credentials go in username and password_file)", raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
			return "", false, fmt.Errorf("%q: port must be 1 to 65535", raw)
		}
		port = p
	}
	return net.JoinHostPort(u.Hostname(), port), useTLS, nil
}

// Origin names the broker at raw as every Peat client of it names it,
// whatever its client id: "mqtt://host:port" or "mqtts://host:port",
// with the default port written out and the host in lower case. A sink
// and a source on one broker have the same Origin (no echo: a sink skips
// records a source brought down from its own upstream). A URL ParseURL
// refuses is returned as it is.
func Origin(raw string) string {
	addr, useTLS, err := ParseURL(raw)
	if err != nil {
		return raw
	}
	host, port, _ := net.SplitHostPort(addr)
	scheme := "mqtt://"
	if useTLS {
		scheme = "mqtts://"
	}
	return scheme + net.JoinHostPort(lower(host), port)
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Error is an upstream failure with its reason for the errors metrics
// (it implements sink.Reasoner and source.Reasoner).
type Error struct {
	reason string
	err    error
}

// Errorf is an Error with reason, its text formatted as fmt.Errorf.
func Errorf(reason, format string, a ...any) *Error {
	return &Error{reason: reason, err: fmt.Errorf(format, a...)}
}

// WithReason wraps err with reason.
func WithReason(reason string, err error) *Error { return &Error{reason: reason, err: err} }

func (e *Error) Error() string  { return e.err.Error() }
func (e *Error) Unwrap() error  { return e.err }
func (e *Error) Reason() string { return e.reason }

// Dial is how to reach one upstream.
type Dial struct {
	Addr   string      // host:port
	UseTLS bool        // mqtts
	TLS    *tls.Config // nil uses the system roots
	// Timeout bounds the dial, the TLS handshake and the CONNACK.
	Timeout time.Duration
	// Wrap, when set, wraps the TCP connection before TLS.
	Wrap func(net.Conn) net.Conn
}

// Connect dials d, sends connect (a CONNECT packet, encoded here) and
// returns the connection, a reader positioned after the CONNACK, and the
// CONNACK, once it accepted the session; a CONNACK with a failure code is
// an Error ("auth" or "refused"). ctx and d.Timeout bound all of it.
func Connect(ctx context.Context, d Dial, connect packets.Packet) (net.Conn, *bufio.Reader, packets.Packet, error) {
	ctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	var nd net.Dialer
	nc, err := nd.DialContext(ctx, "tcp", d.Addr)
	if err != nil {
		return nil, nil, packets.Packet{}, err
	}
	if d.Wrap != nil {
		nc = d.Wrap(nc)
	}
	if d.UseTLS {
		tc := d.TLS.Clone()
		if tc == nil {
			tc = &tls.Config{}
		}
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(d.Addr)
		}
		tlsConn := tls.Client(nc, tc)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return nil, nil, packets.Packet{}, &Error{reason: "tls", err: err}
		}
		nc = tlsConn
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) })
	br, ack, err := handshake(nc, connect)
	if !stop() || err != nil {
		_ = nc.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, nil, ack, err
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, br, ack, nil
}

func handshake(nc net.Conn, pk packets.Packet) (*bufio.Reader, packets.Packet, error) {
	var buf bytes.Buffer
	if err := pk.ConnectEncode(&buf); err != nil {
		return nil, packets.Packet{}, &Error{reason: "protocol", err: fmt.Errorf("encode CONNECT: %w", err)}
	}
	if _, err := nc.Write(buf.Bytes()); err != nil {
		return nil, packets.Packet{}, err
	}
	br := bufio.NewReaderSize(nc, 4096)
	ack, err := ReadPacket(br, pk.ProtocolVersion, nil, MaxControlPacket)
	if err != nil {
		return nil, ack, err
	}
	if ack.FixedHeader.Type != packets.Connack {
		return nil, ack, &Error{reason: "protocol", err: fmt.Errorf("got packet type %d before CONNACK", ack.FixedHeader.Type)}
	}
	if ack.ReasonCode != 0 {
		return nil, ack, refusedConnect(ack)
	}
	return br, ack, nil
}

// refusedConnect explains a CONNACK with a failure code.
func refusedConnect(ack packets.Packet) error {
	reason := "refused"
	switch ack.ReasonCode {
	case 0x04, 0x05, 0x86, 0x87, 0x8C: // v3 bad credentials / not authorised; v5 the same, bad auth method
		reason = "auth"
	}
	msg := fmt.Sprintf("upstream refused the connection: CONNACK reason %#x", ack.ReasonCode)
	if s := ack.Properties.ReasonString; s != "" {
		msg += " (" + s + ")"
	}
	return &Error{reason: reason, err: errors.New(msg)}
}

// MaxControlPacket bounds a packet other than a PUBLISH a client reads:
// acks, pings, and a CONNACK, SUBACK or DISCONNECT with a reason string.
const MaxControlPacket = 64 << 10

// ReadPacket reads one packet from a server, of at most max bytes after
// its fixed header, into scratch when it fits. mochi's decoders point the
// packet's strings and payload into the body: with scratch, the caller
// must be done with them before the next read. A packet type a client
// does not expect from a server is returned undecoded.
func ReadPacket(r *bufio.Reader, version byte, scratch []byte, max int) (packets.Packet, error) {
	pk := packets.Packet{ProtocolVersion: version}
	hb, err := r.ReadByte()
	if err != nil {
		return pk, err
	}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, &Error{reason: "protocol", err: fmt.Errorf("decode fixed header: %w", err)}
	}
	n, _, err := packets.DecodeLength(r)
	if err != nil {
		return pk, err
	}
	if n > max {
		return pk, &Error{reason: "protocol", err: fmt.Errorf("packet type %d of %d bytes from upstream (at most %d)", pk.FixedHeader.Type, n, max)}
	}
	pk.FixedHeader.Remaining = n
	var body []byte
	if n <= len(scratch) {
		body = scratch[:n]
	} else {
		body = make([]byte, n)
	}
	if _, err := io.ReadFull(r, body); err != nil {
		return pk, err
	}
	var decode func([]byte) error
	switch pk.FixedHeader.Type {
	case packets.Connack:
		decode = pk.ConnackDecode
	case packets.Publish:
		decode = pk.PublishDecode
	case packets.Puback:
		decode = pk.PubackDecode
	case packets.Pubrec:
		decode = pk.PubrecDecode
	case packets.Pubrel:
		decode = pk.PubrelDecode
	case packets.Pubcomp:
		decode = pk.PubcompDecode
	case packets.Suback:
		decode = pk.SubackDecode
	case packets.Pingresp:
		decode = pk.PingrespDecode
	case packets.Disconnect:
		decode = pk.DisconnectDecode
	default:
		return pk, nil // the caller says what it did not expect
	}
	if err := decode(body); err != nil {
		return pk, &Error{reason: "protocol", err: fmt.Errorf("decode packet type %d: %w", pk.FixedHeader.Type, err)}
	}
	return pk, nil
}

// Ack encodes a PUBACK, PUBREC, PUBREL or PUBCOMP (typ) of pid with
// reason code 0 (success): two bytes of packet id, in either version.
func Ack(typ byte, pid uint16) []byte {
	flags := byte(0)
	if typ == packets.Pubrel {
		flags = 0x02
	}
	return []byte{typ<<4 | flags, 2, byte(pid >> 8), byte(pid)}
}
