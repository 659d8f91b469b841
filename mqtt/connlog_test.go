package mqtt

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// logLine is one record a logRecorder captured, attributes as text.
type logLine struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// logRecorder is a slog handler that keeps every record.
type logRecorder struct {
	mu    *sync.Mutex
	lines *[]logLine
	with  []slog.Attr
	level slog.Level
}

func newLogRecorder(level slog.Level) logRecorder {
	return logRecorder{mu: new(sync.Mutex), lines: new([]logLine), level: level}
}

func (h logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h logRecorder) Handle(_ context.Context, r slog.Record) error {
	line := logLine{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.with {
		line.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		line.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	*h.lines = append(*h.lines, line)
	h.mu.Unlock()
	return nil
}

func (h logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	h.with = append(append([]slog.Attr(nil), h.with...), as...)
	return h
}

func (h logRecorder) WithGroup(string) slog.Handler { return h }

// find returns the lines for which match holds.
func (h logRecorder) find(match func(logLine) bool) []logLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logLine
	for _, l := range *h.lines {
		if match(l) {
			out = append(out, l)
		}
	}
	return out
}

func TestConnLog_LinesSayWhatWhoAndWhere(t *testing.T) {
	rec := newLogRecorder(slog.LevelDebug)
	b := newTestBroker(t, newMemLog(t, "default=#"), func(c *Config) { c.Logger = slog.New(rec) })

	bad := dialRaw(t, b, "dev-1", 5)
	bad.WriteBytes(publishBytes(5, "sensors/+", 1, 1, "x"))
	expectClosed(t, bad)
	var line logLine
	testwait.Eventually(t, "the refusal's log line", func() bool {
		got := rec.find(func(l logLine) bool { return l.attrs[attrClient] == "dev-1" && l.level >= slog.LevelWarn })
		if len(got) > 0 {
			line = got[0]
		}
		return len(got) > 0
	})
	if !strings.Contains(line.msg, "wildcard") || line.attrs[attrRemote] != bad.Conn().LocalAddr().String() {
		t.Fatalf("line = %+v, want a message about the wildcard and remote %s", line, bad.Conn().LocalAddr())
	}

	idle := dialRaw(t, b, "idle-1", 4)
	idle.Close() // gone without DISCONNECT, as a sensor losing power
	testwait.Eventually(t, "the lost connection's log line", func() bool {
		return len(rec.find(func(l logLine) bool { return l.attrs[attrClient] == "idle-1" })) > 0
	})
	for _, l := range rec.find(func(l logLine) bool { return l.attrs[attrClient] == "idle-1" }) {
		if l.level >= slog.LevelWarn || l.msg == "" || l.attrs[attrRemote] != idle.Conn().LocalAddr().String() {
			t.Fatalf("idle client's line = %+v, want below WARN with a message and its remote", l)
		}
	}
	if empty := rec.find(func(l logLine) bool { return l.msg == "" }); len(empty) > 0 {
		t.Fatalf("lines with an empty message: %+v", empty)
	}
}

func TestConnLog_BurstIsBounded(t *testing.T) {
	rec := newLogRecorder(slog.LevelDebug)
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(rec)
	b, err := New(cfg, newMemLog(t, "default=#"))
	if err != nil {
		t.Fatal(err)
	}
	var clock struct {
		sync.Mutex
		now time.Time
	}
	clock.now = time.Now()
	b.conns.limit.now = func() time.Time { clock.Lock(); defer clock.Unlock(); return clock.now }
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		_ = b.Close(ctx)
	})

	const n = 4 * connLogBurst
	refused := func(l logLine) bool { return l.msg == "refused connection: CONNECT too large" }
	seen := func() int { // lines the limiter was asked for
		b.conns.limit.mu.Lock()
		defer b.conns.limit.mu.Unlock()
		if w := b.conns.limit.mu.keys[ReasonConnectTooLarge]; w != nil {
			return w.n + w.suppressed
		}
		return 0
	}
	for i := 0; i < n; i++ {
		conn := dialTCP(t, b)
		if _, err := conn.Write(connectHead(4, 1<<20)); err != nil {
			t.Fatal(err)
		}
		readUntilClosed(t, conn)
	}
	testwait.Eventually(t, fmt.Sprintf("%d refusals logged or suppressed", n), func() bool { return seen() == n })
	// The limiter counts a line before its writer logs it: wait for the
	// lines it let through, then count them all.
	testwait.Eventually(t, "the lines let through", func() bool { return len(rec.find(refused)) >= connLogBurst })
	if got := len(rec.find(refused)); got != connLogBurst {
		t.Fatalf("%d identical refusals logged %d lines, want %d", n, got, connLogBurst)
	}

	clock.Lock()
	clock.now = clock.now.Add(connLogInterval)
	clock.Unlock()
	conn := dialTCP(t, b)
	if _, err := conn.Write(connectHead(4, 1<<20)); err != nil {
		t.Fatal(err)
	}
	readUntilClosed(t, conn)
	testwait.Eventually(t, "a line after the interval", func() bool { return len(rec.find(refused)) == connLogBurst+1 })
	last := rec.find(refused)[connLogBurst]
	if got, want := last.attrs[attrSuppressed], fmt.Sprint(n-connLogBurst); got != want {
		t.Fatalf("suppressed = %q, want %s", got, want)
	}
	if last.attrs[attrRemote] == "" {
		t.Fatalf("line without the remote address: %+v", last)
	}
}

func TestMochiLogHandler(t *testing.T) {
	rec := newLogRecorder(slog.LevelInfo)
	log := slog.New(mochiLogHandler{Handler: rec, limit: newRateLimit(2, time.Hour)})
	log.Warn("", "error", "read connection: EOF")
	log.Warn("error processing packet", "error", packets.ErrProtocolViolationNoPacketID)
	for i := 0; i < 5; i++ {
		log.Warn("packet ids exhausted", "client", "c")
	}
	all := rec.find(func(logLine) bool { return true })
	if len(all) != 3 {
		t.Fatalf("lines = %+v, want the filled-in empty one and two of the repeated one", all)
	}
	if all[0].msg == "" {
		t.Fatalf("empty message passed through: %+v", all[0])
	}
	for _, l := range all {
		if l.msg == "error processing packet" {
			t.Fatalf("per-packet error not lowered below INFO: %+v", l)
		}
	}
}

func TestConnEnd_Levels(t *testing.T) {
	cases := []struct {
		name      string
		err       error
		cause     error
		connacked bool
		want      slog.Level
	}{
		{"normal DISCONNECT", nil, packets.CodeDisconnect, true, slog.LevelDebug},
		{"probe closes before CONNECT", fmt.Errorf("read connection: %w", io.EOF), nil, false, slog.LevelDebug},
		{"idle client goes away", io.EOF, nil, true, slog.LevelInfo},
		{"silent connection", fmt.Errorf("read connection: %w", ErrConnectTimeout), nil, false, slog.LevelInfo},
		{"session taken over", nil, packets.ErrSessionTakenOver, true, slog.LevelInfo},
		{"protocol error", packets.ErrProtocolViolationNoPacketID, nil, true, slog.LevelWarn},
		// Logged at WARN by the auth hook as it refuses, with the user
		// and the reason (connLog.denied); the end of the connection is
		// detail.
		{"bad credentials", packets.ErrBadUsernameOrPassword, nil, false, slog.LevelDebug},
	}
	for _, tc := range cases {
		if got, msg, _ := connEnd(tc.err, tc.cause, tc.connacked); got != tc.want || msg == "" {
			t.Errorf("%s: level %v message %q, want %v and a message", tc.name, got, msg, tc.want)
		}
	}
}
