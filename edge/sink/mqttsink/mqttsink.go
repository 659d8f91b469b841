package mqttsink

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/logstore"
)

// Defaults of Config.
const (
	DefaultWindow    = 64
	DefaultKeepalive = 30 * time.Second
	DefaultTopic     = "{topic}"
	// SessionExpiry is the MQTT 5 Session Expiry Interval asked for (one
	// day): the upstream keeps the session across a reconnect, and the
	// position in the log keeps everything else.
	SessionExpiry = 24 * 60 * 60
)

// User properties added with Config.Properties.
const (
	PropStream = "peat-stream"
	PropOffset = "peat-offset"
	PropTime   = "peat-time"
)

// Config is one MQTT upstream.
type Config struct {
	// URL is mqtt://host:port or mqtts://host:port (port defaults 1883
	// and 8883).
	URL      string
	ClientID string
	Version  byte // 4 (3.1.1) or 5
	// QoS is 1 (at least once) or 2 (exactly once across reconnects; at
	// least once across a restart of the node).
	QoS byte
	// Window is the most records in flight; an MQTT 5 upstream's Receive
	// Maximum lowers it.
	Window     int
	Username   string
	Password   string
	TLS        *tls.Config // for mqtts; nil uses the system roots
	Topic      string      // template: {topic} {stream} {node}
	Node       string      // what {node} becomes
	Properties bool        // MQTT 5: add peat-stream, peat-offset, peat-time
	// Keepalive is the MQTT keepalive; a PINGREQ goes every half of it, and
	// a connection that brought nothing back for a whole one is dead (a
	// black hole is found within it).
	Keepalive time.Duration
	// Extra, when set, adds user properties after the peat ones (MQTT 5):
	// the Peat sink's description of the record (edge/sink/peatsink).
	Extra func(stream string, r *logstore.Record) []packets.UserProperty
}

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

// CheckTopic checks a topic template.
func CheckTopic(tmpl string) error {
	rest := tmpl
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return fmt.Errorf("%q: unclosed {", tmpl)
		}
		switch rest[i : i+j+1] {
		case "{topic}", "{stream}", "{node}":
		default:
			return fmt.Errorf("%q: unknown placeholder %s (want {topic}, {stream} or {node})", tmpl, rest[i:i+j+1])
		}
		rest = rest[i+j+1:]
	}
	if strings.ContainsAny(tmpl, "+#") {
		return fmt.Errorf("%q: wildcards are not allowed in a topic", tmpl)
	}
	if tmpl == "" {
		return errors.New("empty topic template")
	}
	return nil
}

// Upstream is an MQTT broker a sink publishes to, with QoS 1.
type Upstream struct {
	cfg    Config
	topic  template // cfg.Topic, cut at its placeholders
	addr   string
	useTLS bool
	sess   *session
	// wiped: the upstream's session for this client id was cleared since
	// the process started (QoS 2 only: packet ids the broker still holds
	// from before a crash must not swallow new PUBLISHes).
	wiped bool
}

// session is the client side of the MQTT session: the packet ids in
// flight, kept across connections of one process so that QoS 2 messages
// are completed under their ids after a reconnect.
type session struct {
	mu      sync.Mutex
	out     map[uint16]*outMsg
	lastPid uint16
	seq     uint64
}

// outMsg is one PUBLISH in flight.
type outMsg struct {
	id       uint64 // delivery id
	seq      uint64 // send order
	released bool   // QoS 2: PUBREC came, PUBREL sent
	pk       []byte // QoS 2: the encoded PUBLISH, to send again with DUP
}

// take gives delivery id a free packet id.
func (s *session) take(id uint64) (uint16, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.out) >= 65535 {
		return 0, &Error{reason: "protocol", err: errors.New("no free packet id")}
	}
	for {
		s.lastPid++
		if s.lastPid == 0 {
			s.lastPid = 1
		}
		if _, used := s.out[s.lastPid]; !used {
			s.seq++
			s.out[s.lastPid] = &outMsg{id: id, seq: s.seq}
			return s.lastPid, nil
		}
	}
}

// done ends pid's exchange and returns its delivery id, and how many
// exchanges are still in flight.
func (s *session) done(pid uint16) (id uint64, ok bool, left int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.out[pid]
	if !ok {
		return 0, false, len(s.out)
	}
	delete(s.out, pid)
	return m.id, true, len(s.out)
}

func (s *session) reset() {
	s.mu.Lock()
	s.out = map[uint16]*outMsg{}
	s.mu.Unlock()
}

var _ sink.Upstream = (*Upstream)(nil)

// New checks cfg and returns the upstream; it dials nothing.
func New(cfg Config) (*Upstream, error) {
	addr, useTLS, err := ParseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if cfg.Version != 4 && cfg.Version != 5 {
		return nil, fmt.Errorf("mqttsink: version %d: want 4 or 5", cfg.Version)
	}
	if cfg.QoS == 0 {
		cfg.QoS = 1
	}
	if cfg.QoS != 1 && cfg.QoS != 2 {
		return nil, fmt.Errorf("mqttsink: QoS %d: want 1 or 2", cfg.QoS)
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	cfg.Window = min(cfg.Window, 65535)
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = DefaultKeepalive
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if err := CheckTopic(cfg.Topic); err != nil {
		return nil, err
	}
	return &Upstream{cfg: cfg, topic: compileTemplate(cfg.Topic), addr: addr, useTLS: useTLS,
		sess: &session{out: map[uint16]*outMsg{}}}, nil
}

func (u *Upstream) String() string { return u.cfg.URL }

// Connect dials, sends CONNECT (clean start off: a persistent session)
// and waits for a successful CONNACK, all within the keepalive. With QoS
// 2, the first connection of the process clears the upstream's session
// first, and a later one resumes the messages in flight.
func (u *Upstream) Connect(ctx context.Context) (sink.Conn, error) {
	if u.cfg.QoS == 2 && !u.wiped {
		c, err := u.connect(ctx, true)
		if err != nil {
			return nil, err
		}
		c.disconnect()
		u.wiped = true
		u.sess.reset()
	}
	c, err := u.connect(ctx, false)
	if err != nil {
		return nil, err
	}
	if err := c.resume(); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func (u *Upstream) connect(ctx context.Context, clean bool) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, u.cfg.Keepalive)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", u.addr)
	if err != nil {
		return nil, err
	}
	nc = withQuickAck(nc)
	if u.useTLS {
		tc := u.cfg.TLS.Clone()
		if tc == nil {
			tc = &tls.Config{}
		}
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(u.addr)
		}
		tlsConn := tls.Client(nc, tc)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return nil, &Error{reason: "tls", err: err}
		}
		nc = tlsConn
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) })
	c, err := u.handshake(nc, clean)
	if !stop() || err != nil {
		_ = nc.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return c, nil
}

func (u *Upstream) handshake(nc net.Conn, clean bool) (*conn, error) {
	keepalive := uint16(min(max(u.cfg.Keepalive/time.Second, 1), 65535))
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: u.cfg.Version,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			ClientIdentifier: u.cfg.ClientID,
			Clean:            clean,
			Keepalive:        keepalive,
		},
	}
	if u.cfg.Username != "" {
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(u.cfg.Username)
	}
	if u.cfg.Password != "" {
		pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(u.cfg.Password)
	}
	if u.cfg.Version == 5 {
		pk.Properties.SessionExpiryInterval, pk.Properties.SessionExpiryIntervalFlag = SessionExpiry, true
	}
	var buf bytes.Buffer
	if err := pk.ConnectEncode(&buf); err != nil {
		return nil, &Error{reason: "protocol", err: fmt.Errorf("encode CONNECT: %w", err)}
	}
	if _, err := nc.Write(buf.Bytes()); err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(nc, 4096)
	ack, err := readPacket(br, u.cfg.Version, nil)
	if err != nil {
		return nil, err
	}
	if ack.FixedHeader.Type != packets.Connack {
		return nil, &Error{reason: "protocol", err: fmt.Errorf("got packet type %d before CONNACK", ack.FixedHeader.Type)}
	}
	if ack.ReasonCode != 0 {
		return nil, refusedConnect(ack)
	}
	window := u.cfg.Window
	interval := u.cfg.Keepalive
	if u.cfg.Version == 5 {
		if rm := ack.Properties.ReceiveMaximum; rm > 0 {
			window = min(window, int(rm))
		}
		if ack.Properties.MaximumQosFlag && ack.Properties.MaximumQos < 1 {
			return nil, &Error{reason: "refused", err: errors.New("upstream allows QoS 0 only (CONNACK Maximum QoS)")}
		}
		if ack.Properties.ServerKeepAliveFlag && ack.Properties.ServerKeepAlive > 0 {
			interval = min(interval, time.Duration(ack.Properties.ServerKeepAlive)*time.Second)
		}
	}
	return &conn{
		u: u, nc: nc, br: br, bw: bufio.NewWriterSize(nc, 16<<10),
		window: window, keepalive: interval, sessionPresent: ack.SessionPresent,
		acks: make(chan uint64, 2*window+4), done: make(chan struct{}),
	}, nil
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

// Error is an upstream failure with its reason for peat_sink_errors_total.
type Error struct {
	reason string
	err    error
}

func (e *Error) Error() string  { return e.err.Error() }
func (e *Error) Unwrap() error  { return e.err }
func (e *Error) Reason() string { return e.reason }

// conn is one connection. The pump calls Send and Flush; the reader
// goroutine turns PUBACKs into acks; the pinger keeps the keepalive and
// declares the connection dead when nothing came back for a keepalive.
type conn struct {
	u         *Upstream
	nc        net.Conn
	br        *bufio.Reader
	rbuf      [128]byte // readLoop's space for a packet's body (acks are 2 to a few bytes)
	window    int
	keepalive time.Duration
	acks      chan uint64

	wmu   sync.Mutex // guards bw, props and the writes of the pump and the pinger
	bw    *bufio.Writer
	props []byte // Send's scratch space for MQTT 5 properties

	mu struct {
		sync.Mutex
		lastRead time.Time
	}
	sessionPresent bool
	keeps          bool // resumed the session's messages in flight (QoS 2)

	done    chan struct{} // closed by fail
	once    sync.Once
	err     error
	wg      sync.WaitGroup
	closing sync.Once
}

var (
	_ sink.Conn   = (*conn)(nil)
	_ sink.Keeper = (*conn)(nil)
)

// KeepsInflight reports that this connection completes the messages its
// predecessor left in flight (QoS 2 with the session present).
func (c *conn) KeepsInflight() bool { return c.keeps }

// resume starts the connection's goroutines. With QoS 2 and the session
// present upstream, it first sends the messages in flight again, in their
// order: PUBREL for those the upstream has (PUBREC came), the PUBLISH with
// DUP for the others. Otherwise the session starts empty and the sink
// sends again from its position.
func (c *conn) resume() error {
	s := c.u.sess
	s.mu.Lock()
	if c.u.cfg.QoS != 2 || !c.sessionPresent {
		s.out = map[uint16]*outMsg{}
		s.mu.Unlock()
		c.start()
		return nil
	}
	c.keeps = true
	pids := make([]uint16, 0, len(s.out))
	for pid := range s.out {
		pids = append(pids, pid)
	}
	slices.SortFunc(pids, func(a, b uint16) int { return cmp.Compare(s.out[a].seq, s.out[b].seq) })
	var buf []byte
	for _, pid := range pids {
		m := s.out[pid]
		if m.released {
			buf = append(buf, pubrel(pid)...)
		} else {
			b := append([]byte(nil), m.pk...)
			b[0] |= 0x08 // DUP
			buf = append(buf, b...)
		}
	}
	s.mu.Unlock()
	c.start()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.write(buf); err != nil {
		return err
	}
	if err := c.bw.Flush(); err != nil {
		c.fail(err)
		return err
	}
	return nil
}

// pubrel encodes a PUBREL (success) for pid.
func pubrel(pid uint16) []byte {
	return []byte{packets.Pubrel<<4 | 0x02, 2, byte(pid >> 8), byte(pid)}
}

// disconnect sends DISCONNECT and closes a connection that was never
// started.
func (c *conn) disconnect() {
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.keepalive))
	_, _ = c.nc.Write([]byte{packets.Disconnect << 4, 0})
	_ = c.nc.Close()
}

func (c *conn) start() {
	c.mu.lastRead = time.Now()
	c.wg.Add(2)
	go c.readLoop()
	go c.pingLoop()
}

func (c *conn) Window() int         { return c.window }
func (c *conn) Acks() <-chan uint64 { return c.acks }

func (c *conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// fail ends the connection with err (the first one wins).
func (c *conn) fail(err error) {
	c.once.Do(func() {
		c.err = err
		close(c.done)
		_ = c.nc.Close()
	})
}

// Close ends the connection and waits for its goroutines.
func (c *conn) Close() error {
	c.closing.Do(func() {
		c.fail(errors.New("closed"))
		c.wg.Wait()
	})
	return nil
}

// Send encodes d as a PUBLISH into the write buffer. Once it has a
// packet id the message belongs to the session, even if the write fails:
// with QoS 2 a resumed session sends it again under that id.
func (c *conn) Send(ctx context.Context, d sink.Delivery) error {
	pid, err := c.u.sess.take(d.ID)
	if err != nil {
		return err
	}
	r := d.Record
	c.wmu.Lock()
	defer c.wmu.Unlock()
	// Encoded where the write buffer has room (AvailableBuffer), so that
	// writing it copies nothing unless the buffer is full.
	pk, err := c.u.appendPublish(c.bw.AvailableBuffer(), &c.props, d.Stream, r, pid)
	if err != nil {
		c.u.sess.done(pid)
		return &Error{reason: "protocol", err: fmt.Errorf("encode PUBLISH of %s offset %d: %w", d.Stream, r.Offset, err)}
	}
	if c.u.cfg.QoS == 2 {
		c.u.sess.mu.Lock()
		if m := c.u.sess.out[pid]; m != nil {
			m.pk = append([]byte(nil), pk...)
		}
		c.u.sess.mu.Unlock()
	}
	if err := c.Err(); err != nil {
		return err
	}
	return c.write(pk)
}

// write buffers b; c.wmu is held. A write that blocks longer than the
// keepalive (a black hole with full socket buffers) fails the connection:
// the deadline is set when b does not fit the buffer (the only case in
// which Write reaches the socket), and by Flush.
func (c *conn) write(b []byte) error {
	if len(b) > c.bw.Available() {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.keepalive))
	}
	if _, err := c.bw.Write(b); err != nil {
		c.fail(err)
		return err
	}
	return nil
}

// Flush writes what Send buffered.
func (c *conn) Flush(ctx context.Context) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.keepalive))
	if err := c.bw.Flush(); err != nil {
		c.fail(err)
		return err
	}
	return nil
}

// readLoop reads the upstream's packets until the connection fails.
//
// Acknowledgements go to the pump in groups of sink.Batch (the pump acts
// on no fewer), or at once when nothing else is in flight: each hand-over
// wakes the pump, and one per PUBACK cost more than the pump's own work.
func (c *conn) readLoop() {
	defer c.wg.Done()
	var pending []uint64 // acknowledged, not handed to the pump yet
	defer func() {
		for _, id := range pending { // acks has room for a window
			select {
			case c.acks <- id:
			default:
			}
		}
		close(c.acks) // the pump's sign that the connection ended
	}()
	batch := sink.Batch(c.window)
	for {
		pk, err := readPacket(c.br, c.u.cfg.Version, c.rbuf[:])
		if err != nil {
			c.fail(err)
			return
		}
		c.mu.Lock()
		c.mu.lastRead = time.Now()
		c.mu.Unlock()
		switch pk.FixedHeader.Type {
		case packets.Puback, packets.Pubrec, packets.Pubcomp:
			if pk.ReasonCode >= 0x80 {
				c.fail(&Error{reason: "refused", err: fmt.Errorf("upstream refused a PUBLISH: %s reason %#x %s",
					packetName[pk.FixedHeader.Type], pk.ReasonCode, pk.Properties.ReasonString)})
				return
			}
			if pk.FixedHeader.Type == packets.Pubrec {
				if err := c.released(pk.PacketID); err != nil {
					return
				}
				continue
			}
			id, ok, left := c.u.sess.done(pk.PacketID)
			if !ok {
				continue // an ack for nothing in flight: ignore, as brokers do
			}
			if pending = append(pending, id); len(pending) < batch && left > 0 {
				continue
			}
			for i, id := range pending {
				select {
				case c.acks <- id:
				case <-c.done:
					pending = pending[i:] // the deferred hand-over tries these
					return
				}
			}
			pending = pending[:0]
		case packets.Pingresp:
		case packets.Disconnect:
			c.fail(&Error{reason: "refused", err: fmt.Errorf("upstream disconnected: reason %#x %s",
				pk.ReasonCode, pk.Properties.ReasonString)})
			return
		default:
			c.fail(&Error{reason: "protocol", err: fmt.Errorf("unexpected packet type %d from upstream", pk.FixedHeader.Type)})
			return
		}
	}
}

var packetName = map[byte]string{packets.Puback: "PUBACK", packets.Pubrec: "PUBREC", packets.Pubcomp: "PUBCOMP"}

// released answers a PUBREC with PUBREL; from now on the upstream has the
// message, and a resumed session sends the PUBREL again, not the PUBLISH.
func (c *conn) released(pid uint16) error {
	s := c.u.sess
	s.mu.Lock()
	if m := s.out[pid]; m != nil {
		m.released, m.pk = true, nil
	}
	s.mu.Unlock()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.write(pubrel(pid)); err != nil {
		return err
	}
	if err := c.bw.Flush(); err != nil {
		c.fail(err)
		return err
	}
	return nil
}

// pingLoop sends a PINGREQ every half keepalive and fails the connection
// when nothing was read for a whole keepalive.
func (c *conn) pingLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.keepalive / 2)
	defer t.Stop()
	ping := []byte{packets.Pingreq << 4, 0}
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		c.mu.Lock()
		quiet := time.Since(c.mu.lastRead)
		c.mu.Unlock()
		if quiet > c.keepalive {
			c.fail(&Error{reason: "timeout", err: fmt.Errorf("nothing from upstream for %v (keepalive)", quiet.Round(time.Millisecond))})
			return
		}
		c.wmu.Lock()
		err := c.write(ping)
		if err == nil {
			err = c.bw.Flush()
			if err != nil {
				c.fail(err)
			}
		}
		c.wmu.Unlock()
		if err != nil {
			return
		}
	}
}

// maxPacket bounds what the sink reads from an upstream: acks, pings and a
// CONNACK or DISCONNECT with a reason string.
const maxPacket = 64 << 10

// readPacket reads one packet from a server, into scratch when it fits.
// mochi's decoders point the packet's strings into the body: with scratch,
// the caller is done with them (readLoop formats them into its error at
// once) before the next read.
func readPacket(r *bufio.Reader, version byte, scratch []byte) (packets.Packet, error) {
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
	if n > maxPacket {
		return pk, &Error{reason: "protocol", err: fmt.Errorf("packet type %d of %d bytes from upstream", pk.FixedHeader.Type, n)}
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
	case packets.Puback:
		decode = pk.PubackDecode
	case packets.Pubrec:
		decode = pk.PubrecDecode
	case packets.Pubcomp:
		decode = pk.PubcompDecode
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
