package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session/state"
)

// replayWindow is the Receive Maximum `peat replay` asks for: how many
// QoS 1 records the broker may have in flight to it. A group consumer that
// is killed gets at most this many records again.
const replayWindow = 100

// replayConnectTimeout bounds the TCP dial, CONNECT and SUBSCRIBE.
const replayConnectTimeout = 10 * time.Second

const replayUsage = `Usage: peat replay [flags] FILTER

Prints the records of the stream that captures FILTER, one line each:

  OFFSET TIMESTAMP TOPIC PAYLOAD

TIMESTAMP is the broker's append time in UTC (RFC 3339, milliseconds), "-"
when the broker sent none. PAYLOAD is printed as is when it is printable
UTF-8 text; text with control characters (newline, tab...) or an empty
payload is printed Go-quoted ("a\nb", ""); anything that is not UTF-8 is
printed as 0x followed by hex.

Without --follow it stops once it has printed the records that were stored
when it subscribed, or after --idle without a record (records near the end
may not match FILTER). With --group it reads through the named durable
group: it starts at the group's committed offset and acknowledges each record
after printing it, so the next run continues after the last printed record.

Flags may come before or after FILTER; "--" ends them (for a FILTER that
starts with '-').

Examples:
  peat replay --from earliest 'sensors/#'
  peat replay 'sensors/#' --from -15m --count 10
  peat replay --from -1h --follow 'sensors/+/temp'
  peat replay --group audit 'meters/#'
  PEAT_PASSWORD=... peat replay --user ops --cafile ca.pem --broker gw:8883 'meters/#'

Flags:
`

// replayOptions are the parsed flags of `peat replay`.
type replayOptions struct {
	broker   string
	from     string
	group    string
	follow   bool
	qos      int
	clientID string
	idle     time.Duration
	count    int
	filter   string
	// user, cafile, cert and key: a node with auth and TLS (replay_auth.go).
	user, cafile, cert, key string
}

// newReplayFlags defines the flags of `peat replay` on a new FlagSet,
// bound to o. Its Usage prints replayUsage and the flags to w.
func newReplayFlags(o *replayOptions, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("peat replay", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed once, by replay
	fs.StringVar(&o.broker, "broker", "127.0.0.1:1883", "MQTT address host:port of a Peat node")
	fs.StringVar(&o.from, "from", "earliest", "where to start: earliest, latest, an offset, a negative duration (-15m, -2h, -7d) or an RFC 3339 time")
	fs.StringVar(&o.group, "group", "", "read through this durable group (it starts at its committed offset; excludes --from)")
	fs.BoolVar(&o.follow, "follow", false, "keep printing new records until interrupted")
	fs.IntVar(&o.qos, "qos", 1, "subscription QoS, 0 or 1 (with --group, QoS 0 commits on send: records in flight when it stops are skipped)")
	fs.StringVar(&o.clientID, "client-id", "", "MQTT client id (default: peat-replay- and a random suffix)")
	fs.DurationVar(&o.idle, "idle", 2*time.Second, "without --follow, stop after this long without a record (0: wait for the end)")
	fs.IntVar(&o.count, "count", 0, "stop after this many records (0: no limit)")
	fs.StringVar(&o.user, "user", "", "user name (auth.users_file); the password is read from $"+replayPasswordEnv)
	fs.StringVar(&o.cafile, "cafile", "", "PEM CA certificate: connect with TLS, verifying the broker against it")
	fs.StringVar(&o.cert, "cert", "", "PEM client certificate for TLS (with --key)")
	fs.StringVar(&o.key, "key", "", "PEM key of --cert")
	fs.Usage = func() {
		fmt.Fprint(w, replayUsage)
		printFlags(w, fs)
	}
	return fs
}

// parseReplayArgs parses the arguments of `peat replay`; flags may come
// before or after FILTER. Its errors are usage errors (exit 2);
// flag.ErrHelp when --help was asked for, after printing the help to help.
func parseReplayArgs(args []string, help io.Writer) (replayOptions, error) {
	var o replayOptions
	fs := newReplayFlags(&o, help)
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return o, err // flag printed the help for -h and --help
	}
	var problems []error
	switch len(positional) {
	case 0:
		problems = append(problems, errors.New("missing FILTER (e.g. 'sensors/#')"))
	case 1:
		o.filter = positional[0]
	default:
		problems = append(problems, fmt.Errorf("one FILTER expected, got %d arguments (%q); quote a filter with # or + so the shell does not expand it", len(positional), positional))
	}
	if o.filter == "" && len(positional) == 1 {
		problems = append(problems, errors.New("FILTER is empty"))
	}
	fromSet := false
	fs.Visit(func(f *flag.Flag) { fromSet = fromSet || f.Name == "from" })
	if o.group != "" && fromSet {
		problems = append(problems, errors.New("--from and --group exclude each other: a group starts at its committed offset"))
	}
	if o.from == "" || strings.ContainsAny(o.from, "/+#") {
		problems = append(problems, fmt.Errorf("--from %q: want earliest, latest, an offset, a negative duration or an RFC 3339 time", o.from))
	}
	if strings.ContainsAny(o.group, "/+#") {
		problems = append(problems, fmt.Errorf("--group %q: a group name cannot contain '/', '+' or '#'", o.group))
	}
	if o.qos != 0 && o.qos != 1 {
		problems = append(problems, fmt.Errorf("--qos %d: want 0 or 1", o.qos))
	}
	if o.idle < 0 {
		problems = append(problems, fmt.Errorf("--idle %v: must not be negative", o.idle))
	}
	if o.count < 0 {
		problems = append(problems, fmt.Errorf("--count %d: must not be negative", o.count))
	}
	if o.broker == "" {
		problems = append(problems, errors.New("--broker is empty"))
	}
	return o, errors.Join(problems...)
}

// subscription is the extension-topic filter the options subscribe to.
func (o replayOptions) subscription() string {
	if o.group != "" {
		return "$group/" + o.group + "/+/" + o.filter
	}
	return "$replay/" + o.from + "/+/" + o.filter
}

// record is one delivered record, decoded from its extension topic and
// user properties.
type record struct {
	offset    uint64
	timestamp time.Time // zero when the broker sent none
	topic     string    // the original topic
	payload   []byte
}

// parseDelivery decodes a delivery on `$replay/<from>/<offset>/<topic>` or
// `$group/<name>/<offset>/<topic>`.
func parseDelivery(p *paho.Publish) (record, error) {
	parts := strings.SplitN(p.Topic, "/", 4)
	if len(parts) != 4 || (parts[0] != "$replay" && parts[0] != "$group") {
		return record{}, fmt.Errorf("delivery on %q: not a $replay/ or $group/ topic with an offset level", p.Topic)
	}
	off, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return record{}, fmt.Errorf("delivery on %q: offset level %q is not a decimal offset", p.Topic, parts[2])
	}
	r := record{offset: off, topic: parts[3], payload: p.Payload}
	if p.Properties != nil {
		if ts := p.Properties.User.Get("timestamp"); ts != "" {
			ms, err := strconv.ParseInt(ts, 10, 64)
			if err != nil {
				return record{}, fmt.Errorf("delivery of offset %d: timestamp %q is not unix milliseconds", off, ts)
			}
			r.timestamp = time.UnixMilli(ms)
		}
	}
	return r, nil
}

// formatRecord is the line printed for r, with its newline.
func formatRecord(r record) string {
	ts := "-"
	if !r.timestamp.IsZero() {
		ts = r.timestamp.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	}
	return fmt.Sprintf("%d %s %s %s\n", r.offset, ts, r.topic, formatPayload(r.payload))
}

// formatPayload prints printable text as is, other UTF-8 Go-quoted, and
// anything else as 0x-prefixed hex.
func formatPayload(b []byte) string {
	switch {
	case !utf8.Valid(b):
		return "0x" + hex.EncodeToString(b)
	case len(b) > 0 && isPrintable(b):
		return string(b)
	default:
		return strconv.Quote(string(b))
	}
}

func isPrintable(b []byte) bool {
	for _, r := range string(b) {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// subackInfo is what the broker says about a replay or group subscription
// in its MQTT 5 SUBACK user properties.
type subackInfo struct {
	stream         string
	start, end     uint64
	hasStart       bool
	hasEnd         bool
	notice         string
	malformedProps []string
}

func parseSuback(sa *paho.Suback) subackInfo {
	var info subackInfo
	if sa == nil || sa.Properties == nil {
		return info
	}
	u := sa.Properties.User
	info.stream = u.Get("stream")
	info.notice = u.Get("notice")
	for _, p := range []struct {
		key string
		dst *uint64
		ok  *bool
	}{{"start", &info.start, &info.hasStart}, {"end", &info.end, &info.hasEnd}} {
		v := u.Get(p.key)
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			info.malformedProps = append(info.malformedProps, fmt.Sprintf("%s=%q", p.key, v))
			continue
		}
		*p.dst, *p.ok = n, true
	}
	return info
}

// replayer receives deliveries on paho's router goroutine. Each record is
// printed before paho acknowledges it, and a record that was not printed
// (it arrived after the stop) is never acknowledged, so a group commits
// exactly what was printed.
type replayer struct {
	opts       replayOptions
	out        io.Writer
	subscribed chan struct{} // closed once info is set
	info       subackInfo
	activity   chan struct{} // a record was printed (for --idle)
	finished   chan struct{} // closed after the last record's ack went out
	quit       chan struct{} // closed when replay stops waiting

	// handling is held from a record's handler to the end of its ack, so
	// stop waits for a printed record's ack to be written.
	handling sync.Mutex
	stopped  bool // guarded by handling
	printed  int  // router goroutine only
	approve  bool // router goroutine only: the record being handled was printed, ack it
	locked   bool // router goroutine only: onPublish took handling

	mu  sync.Mutex
	err error // first failure (a malformed delivery, a write error)
}

func newReplayer(o replayOptions, out io.Writer) *replayer {
	return &replayer{
		opts: o, out: out,
		subscribed: make(chan struct{}),
		activity:   make(chan struct{}, 1),
		finished:   make(chan struct{}),
		quit:       make(chan struct{}),
	}
}

// onPublish handles one delivery; paho calls ackSession.Ack right after.
func (r *replayer) onPublish(pr paho.PublishReceived) (bool, error) {
	r.approve, r.locked = false, false
	select {
	case <-r.subscribed:
	case <-r.quit:
		return true, nil
	}
	r.handling.Lock() // Ack unlocks
	r.locked = true
	if r.stopped {
		return true, nil
	}
	rec, err := parseDelivery(pr.Packet)
	if err == nil {
		_, err = io.WriteString(r.out, formatRecord(rec))
	}
	if err != nil {
		r.fail(err)
		r.stopped = true
		return true, nil
	}
	r.approve = true
	r.printed++
	select {
	case r.activity <- struct{}{}:
	default:
	}
	if r.opts.count > 0 && r.printed >= r.opts.count {
		r.stopped = true
	}
	if !r.opts.follow && r.info.hasEnd && rec.offset+1 >= r.info.end {
		r.stopped = true // the last record that was stored when we subscribed
	}
	return true, nil
}

// stop makes the handler print nothing more, once the record being handled
// (if any) is acknowledged.
func (r *replayer) stop() {
	r.handling.Lock()
	r.stopped = true
	r.handling.Unlock()
}

func (r *replayer) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

func (r *replayer) failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// ackSession is paho's in-memory session with acknowledgements filtered:
// paho acks every delivery after the handlers ran; this one sends the ack
// only for a printed record, and closes finished once the ack of the last
// record is written, before replay disconnects.
type ackSession struct {
	*state.State
	r *replayer
}

func (s ackSession) Ack(pb *packets.Publish) error {
	r := s.r
	if !r.locked {
		return nil // not handled: replay is stopping
	}
	defer r.handling.Unlock()
	var err error
	if r.approve {
		err = s.State.Ack(pb)
	}
	if r.stopped {
		select {
		case <-r.finished:
		default:
			close(r.finished)
		}
	}
	return err
}

// lingerConn closes gracefully. When replay stops, the broker may still
// be sending deliveries it will not get acknowledged; closing a socket with
// such unread data makes the kernel send a reset instead of a FIN, and a
// reset can make the broker's kernel drop what it had not read yet: the
// last acknowledgements and the DISCONNECT, so a group committed less than
// was printed (TestReplay_GroupInterruptedMidStream failed about 1 run in
// 8, the next run repeating up to a window of records). Close therefore
// ends the sending side first and reads until the broker closes (or a
// second passes), then closes.
//
// It is also a sync.Locker, which paho.golang takes around each packet it
// writes: a packet is several buffers, and only a bare *net.TCPConn writes
// them in one system call. Through a wrapper each buffer is its own write,
// and paho's pinger, which sends a PINGREQ as soon as it starts, could
// land inside the SUBSCRIBE: the broker dropped the connection as
// malformed and the SUBACK never came (TestReplay_AgainstANode failed about
// 1 run in 8 under -count=30).
type lingerConn struct {
	net.Conn
	sync.Mutex
}

func (c *lingerConn) Close() error {
	if tc, ok := c.Conn.(interface {
		net.Conn
		CloseWrite() error
	}); ok { // *net.TCPConn, *tls.Conn
		_ = tc.CloseWrite()
		_ = tc.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = io.Copy(io.Discard, tc)
	}
	return c.Conn.Close()
}

// replay runs `peat replay` and returns its exit status.
func replay(args []string, stdout, stderr io.Writer) int {
	o, err := parseReplayArgs(args, stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case err != nil:
		fmt.Fprintf(stderr, "peat replay: %v\nRun 'peat replay --help' for the flags.\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := runReplay(ctx, o, stdout, stderr); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "peat replay: %v\n", err)
		return exitError
	}
	return exitOK
}

// runReplay connects, subscribes and prints until the end of the history
// (without --follow), --count records, or ctx is done (Ctrl-C), which are
// all clean stops.
func runReplay(ctx context.Context, o replayOptions, stdout, stderr io.Writer) error {
	if o.clientID == "" {
		o.clientID = fmt.Sprintf("peat-replay-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	}
	dialCtx, cancelDial := context.WithTimeout(ctx, replayConnectTimeout)
	defer cancelDial()
	nc, err := o.dialBroker(dialCtx)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", o.broker, err)
	}
	lc := &lingerConn{Conn: nc}
	r := newReplayer(o, stdout)
	sess := ackSession{State: state.NewInMemory(), r: r}
	defer sess.Close()
	// alive ends when the connection is lost, with the first error as its
	// cause; the waits below end with it.
	alive, lose := context.WithCancelCause(context.Background())
	defer lose(nil)
	c := paho.NewClient(paho.ClientConfig{
		ClientID:          o.clientID,
		Conn:              lc,
		Session:           sess,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){r.onPublish},
		PacketTimeout:     replayConnectTimeout,
		OnClientError:     lose,
		OnServerDisconnect: func(d *paho.Disconnect) {
			reason := ""
			if d.Properties != nil {
				reason = d.Properties.ReasonString
			}
			lose(fmt.Errorf("broker disconnected (reason code 0x%02x %s)", d.ReasonCode, reason))
		},
	})
	window := uint16(replayWindow)
	connect := &paho.Connect{
		ClientID: o.clientID, CleanStart: true, KeepAlive: 30,
		// RequestProblemInfo is false in a zero ConnectProperties, which would
		// ask the broker to leave out the SUBACK's reason and user properties.
		Properties: &paho.ConnectProperties{ReceiveMaximum: &window, RequestProblemInfo: true},
	}
	o.credentials(connect, os.LookupEnv)
	ca, err := c.Connect(dialCtx, connect)
	if err != nil {
		lc.Close()
		if ca != nil && ca.Properties != nil && ca.Properties.ReasonString != "" {
			return fmt.Errorf("connect to %s refused: %s (reason code 0x%02x)", o.broker, ca.Properties.ReasonString, ca.ReasonCode)
		}
		return fmt.Errorf("connect to %s: %w", o.broker, err)
	}
	defer func() {
		close(r.quit) // a handler waiting for the SUBACK returns
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	}()

	sub := o.subscription()
	// paho would wait for a SUBACK from a broker that has hung up until
	// dialCtx ends: the loss ends the wait too.
	subCtx, endSub := context.WithCancel(dialCtx)
	defer context.AfterFunc(alive, endSub)()
	sa, err := c.Subscribe(subCtx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: sub, QoS: byte(o.qos)}}})
	endSub()
	if cause := context.Cause(alive); err != nil && cause != nil {
		err = fmt.Errorf("connection lost: %w", cause)
	}
	if sa != nil && len(sa.Reasons) == 1 && sa.Reasons[0] >= 0x80 {
		reason := "no reason given"
		if sa.Properties != nil && sa.Properties.ReasonString != "" {
			reason = sa.Properties.ReasonString
		}
		return fmt.Errorf("subscribe %s refused: %s (reason code 0x%02x)", sub, reason, sa.Reasons[0])
	}
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", sub, err)
	}
	r.info = parseSuback(sa)
	if r.info.notice != "" {
		fmt.Fprintf(stderr, "peat replay: broker notice: %s\n", r.info.notice)
	}
	if len(r.info.malformedProps) > 0 {
		fmt.Fprintf(stderr, "peat replay: ignoring malformed SUBACK properties %s\n", strings.Join(r.info.malformedProps, ", "))
	}
	close(r.subscribed)
	if !o.follow && r.info.hasStart && r.info.hasEnd && r.info.start >= r.info.end {
		r.stop() // no history to print, and no live record either
		return nil
	}

	var idle <-chan time.Time
	var timer *time.Timer
	if !o.follow && o.idle > 0 {
		timer = time.NewTimer(o.idle)
		defer timer.Stop()
		idle = timer.C
	}
	for {
		select {
		case <-ctx.Done(): // Ctrl-C
			r.stop()
			return r.failure()
		case <-r.finished:
			return r.failure()
		case <-idle:
			r.stop()
			return r.failure()
		case <-r.activity:
			if timer != nil {
				timer.Reset(o.idle)
			}
		case <-alive.Done():
			if f := r.failure(); f != nil {
				return f
			}
			return fmt.Errorf("connection to %s lost: %w", o.broker, context.Cause(alive))
		}
	}
}
