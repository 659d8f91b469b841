package mqttsink

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/internal/mqttclient"
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
	SessionExpiry = mqttclient.SessionExpiry
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
	// KeepEchoes sends the records a source brought down from this same
	// upstream too (the Peat sink: a mirror needs every offset); without
	// it the sink skips them (sink.Originer: no echo).
	KeepEchoes bool
	// Extra, when set, adds user properties after the peat ones (MQTT 5):
	// the Peat sink's description of the record (edge/sink/peatsink).
	Extra func(stream string, r *logstore.Record) []packets.UserProperty
}

// ParseURL checks an upstream URL; it returns host:port and whether TLS
// is on.
func ParseURL(raw string) (addr string, useTLS bool, err error) { return mqttclient.ParseURL(raw) }

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
		return 0, mqttclient.WithReason("protocol", errors.New("no free packet id"))
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

var (
	_ sink.Upstream = (*Upstream)(nil)
	_ sink.Originer = (*Upstream)(nil)
)

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

// Origin is the broker as every Peat client of it names it: the sink
// skips records a source brought down from it (sink.Originer), unless
// KeepEchoes ("" then: it skips nothing).
func (u *Upstream) Origin() string {
	if u.cfg.KeepEchoes {
		return ""
	}
	return mqttclient.Origin(u.cfg.URL)
}

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
	nc, br, ack, err := mqttclient.Connect(ctx, mqttclient.Dial{
		Addr: u.addr, UseTLS: u.useTLS, TLS: u.cfg.TLS, Timeout: u.cfg.Keepalive, Wrap: withQuickAck,
	}, pk)
	if err != nil {
		return nil, err
	}
	window := u.cfg.Window
	interval := u.cfg.Keepalive
	if u.cfg.Version == 5 {
		if rm := ack.Properties.ReceiveMaximum; rm > 0 {
			window = min(window, int(rm))
		}
		if ack.Properties.MaximumQosFlag && ack.Properties.MaximumQos < 1 {
			_ = nc.Close()
			return nil, mqttclient.WithReason("refused", errors.New("upstream allows QoS 0 only (CONNACK Maximum QoS)"))
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

// Error is an upstream failure with its reason for peat_sink_errors_total.
type Error = mqttclient.Error

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
	lastFlush      atomic.Int64 // unix ns of the pump's last Flush: when the wait for acks began
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
func pubrel(pid uint16) []byte { return mqttclient.Ack(packets.Pubrel, pid) }

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
		return mqttclient.WithReason("protocol", fmt.Errorf("encode PUBLISH of %s offset %d: %w", d.Stream, r.Offset, err))
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
	now := time.Now()
	_ = c.nc.SetWriteDeadline(now.Add(c.keepalive))
	if err := c.bw.Flush(); err != nil {
		c.fail(err)
		return err
	}
	c.lastFlush.Store(now.UnixNano())
	return nil
}

// ackStall is how long a PUBACK may come after the last one read or the
// last PUBLISH sent, with more still in flight, before it counts as a
// stall: Linux delays an ACK by 40 ms at least. Two stalls within
// stallSpan turn on acknowledging every read at once (quickAckConn), for
// quickAckFor; then it goes off again, and stays off unless the stalls
// come back. A lone slow ack (a loaded machine, the upstream writing to
// its disk) turns nothing on, and where nothing stalls the extra ACKs
// would cost CPU (see quickAckConn); where the stall is real, it comes
// back once per quickAckFor, 80 ms in 5 s.
const (
	ackStall    = 20 * time.Millisecond
	stallSpan   = time.Second
	quickAckFor = 5 * time.Second
)

// quickAcker is a connection that can acknowledge every read at once
// (quickack_linux.go).
type quickAcker interface{ quickAck(on bool) }

// stallWatch decides when a connection acknowledges every read at once.
type stallWatch struct {
	lastStall, onSince time.Time
	on                 bool
}

// ack notes a PUBACK read at now, gap after the last read or flush, with
// left more in flight; it returns whether quick acks should change, and to what.
func (w *stallWatch) ack(now time.Time, gap time.Duration, left int) (change, on bool) {
	if w.on {
		if now.Sub(w.onSince) < quickAckFor {
			return false, true
		}
		w.on, w.lastStall = false, time.Time{}
		return true, false
	}
	if left == 0 || gap <= ackStall {
		return false, false
	}
	if !w.lastStall.IsZero() && now.Sub(w.lastStall) <= stallSpan {
		w.on, w.onSince = true, now
		return true, true
	}
	w.lastStall = now
	return false, false
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
	qa, _ := c.nc.(quickAcker)
	var stalls stallWatch
	for {
		pk, err := readPacket(c.br, c.u.cfg.Version, c.rbuf[:])
		if err != nil {
			c.fail(err)
			return
		}
		now := time.Now()
		c.mu.Lock()
		since := max(c.mu.lastRead.UnixNano(), c.lastFlush.Load())
		c.mu.lastRead = now
		c.mu.Unlock()
		switch pk.FixedHeader.Type {
		case packets.Puback, packets.Pubrec, packets.Pubcomp:
			if pk.ReasonCode >= 0x80 {
				c.fail(mqttclient.WithReason("refused", fmt.Errorf("upstream refused a PUBLISH: %s reason %#x %s",
					packetName[pk.FixedHeader.Type], pk.ReasonCode, pk.Properties.ReasonString)))
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
			if qa != nil {
				if change, on := stalls.ack(now, time.Duration(now.UnixNano()-since), left); change {
					qa.quickAck(on)
				}
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
			c.fail(mqttclient.WithReason("refused", fmt.Errorf("upstream disconnected: reason %#x %s",
				pk.ReasonCode, pk.Properties.ReasonString)))
			return
		default:
			c.fail(mqttclient.WithReason("protocol", fmt.Errorf("unexpected packet type %d from upstream", pk.FixedHeader.Type)))
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
			c.fail(mqttclient.WithReason("timeout", fmt.Errorf("nothing from upstream for %v (keepalive)", quiet.Round(time.Millisecond))))
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

// readPacket reads one packet from a server (mqttclient.ReadPacket).
func readPacket(r *bufio.Reader, version byte, scratch []byte) (packets.Packet, error) {
	return mqttclient.ReadPacket(r, version, scratch, mqttclient.MaxControlPacket)
}
