package edge

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
)

// logLines is a slog handler that keeps what it is given, as text.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
	h   slog.Handler
}

func newLogLines() *logLines {
	l := &logLines{}
	l.h = slog.NewTextHandler(&lockedWriter{l}, &slog.HandlerOptions{Level: slog.LevelDebug})
	return l
}

type lockedWriter struct{ l *logLines }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	return w.l.buf.Write(p)
}

// lines returns the lines logged at level that contain msg.
func (l *logLines) lines(level slog.Level, msg string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if strings.Contains(line, "level="+level.String()) && strings.Contains(line, msg) {
			out = append(out, line)
		}
	}
	return out
}

const gib = 1 << 30

// A node on a small disk says so: a warning at start naming the free
// space and the reserve, /readyz 503 with the reason while publishes are
// refused for space and 200 again after, and the disk gauges in /metrics.
func TestNode_ReportsRefusingForSpace(t *testing.T) {
	cfg := testConfig(t) // the server profile, the reserve scaled to the disk
	logs := newLogLines()
	n, err := New(cfg, slog.New(logs.h))
	if err != nil {
		t.Fatal(err)
	}
	var free atomic.Uint64
	free.Store(120 << 20)
	n.freeSpace = func(string) (uint64, uint64, error) { return free.Load(), 1 * gib, nil }
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	reserve := logstore.ProfileServer.Reserve(1 * gib)
	if reserve >= 512<<20 || reserve < 120<<20/2 {
		t.Fatalf("the server profile's reserve on a 1 GiB disk is %d: the test needs 120 MiB to be near it", reserve)
	}
	warns := logs.lines(slog.LevelWarn, "disk space near the reserve")
	if len(warns) != 1 || !strings.Contains(warns[0], "free_bytes=125829120") ||
		!strings.Contains(warns[0], "reserve_bytes="+strconv.FormatInt(reserve, 10)) {
		t.Fatalf("start warnings about disk space = %q, want one naming free_bytes=125829120 and reserve_bytes=%d", warns, reserve)
	}

	base := "http://" + n.HTTPAddr().String()
	readyz := func() (int, string) {
		status, _, body := get(t, "GET", base+"/readyz")
		return status, string(body)
	}
	waitReady := func(want int) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			status, body := readyz()
			if status == want {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz = %d %q, want %d", status, body, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	metric := func(name string) string {
		t.Helper()
		_, _, body := get(t, "GET", base+"/metrics")
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, name+"{") {
				return line[strings.LastIndexByte(line, ' ')+1:]
			}
		}
		t.Fatalf("no %s in /metrics", name)
		return ""
	}
	waitReady(200)
	if got := metric("peat_disk_reserve_bytes"); got != strconv.FormatFloat(float64(reserve), 'g', -1, 64) {
		t.Fatalf("peat_disk_reserve_bytes = %s, want %d", got, reserve)
	}
	if got := metric("peat_disk_refusing"); got != "0" {
		t.Fatalf("peat_disk_refusing = %s before the disk filled", got)
	}

	free.Store(10 << 20) // the disk fills up
	body := waitReady(503)
	if !strings.Contains(body, "refusing publishes") || !strings.Contains(body, "10485760 bytes free") {
		t.Fatalf("/readyz body while refusing = %q", body)
	}
	if got := metric("peat_disk_refusing"); got != "1" {
		t.Fatalf("peat_disk_refusing = %s while refusing", got)
	}
	if got := metric("peat_disk_free_bytes"); got != "1.048576e+07" {
		t.Fatalf("peat_disk_free_bytes = %s, want 1.048576e+07", got)
	}
	if status, _, _ := get(t, "GET", base+"/healthz"); status != 200 {
		t.Fatalf("/healthz = %d while refusing for space: the node is alive", status)
	}

	free.Store(2 * gib / 4) // space returns
	waitReady(200)
	if got := metric("peat_disk_refusing"); got != "0" {
		t.Fatalf("peat_disk_refusing = %s after space returned", got)
	}
}

func TestNode_WarnsAtStartOnlyNearTheReserve(t *testing.T) {
	for _, tc := range []struct {
		free uint64
		want string // "" no warning
	}{
		{free: 50 << 20, want: "disk space below the reserve"},
		{free: 150 << 20, want: "disk space near the reserve"},
		{free: 400 << 20, want: ""},
	} {
		logs := newLogLines()
		n := &Node{cfg: testConfig(t), log: slog.New(logs.h)}
		n.warnLowSpace(logstore.SpaceStatus{Known: true, Free: tc.free, Size: gib, Reserve: 100 << 20})
		got := logs.lines(slog.LevelWarn, "disk space")
		switch {
		case tc.want == "" && len(got) != 0:
			t.Errorf("free %d MiB of a 100 MiB reserve: warned %q", tc.free>>20, got)
		case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
			t.Errorf("free %d MiB of a 100 MiB reserve: warnings %q, want %q", tc.free>>20, got, tc.want)
		}
	}
}

func TestNode_WarnsWhenPayloadsOutgrowARecord(t *testing.T) {
	for _, tc := range []struct {
		maxPayload, maxRecord int
		warn                  bool
	}{
		{maxPayload: 1 << 20, maxRecord: 16<<20 - 1024, warn: false},
		{maxPayload: 16 << 20, maxRecord: 16<<20 - 1024, warn: true},
		{maxPayload: 64 << 20, maxRecord: 32<<20 - 1024, warn: true},
	} {
		logs := newLogLines()
		n := &Node{cfg: testConfig(t), log: slog.New(logs.h)}
		n.warnPayloadAboveRecord(tc.maxPayload, tc.maxRecord)
		if got := logs.lines(slog.LevelWarn, "max_payload_bytes"); (len(got) == 1) != tc.warn {
			t.Errorf("payload %d, record %d: warnings %q, want a warning: %v", tc.maxPayload, tc.maxRecord, got, tc.warn)
		}
	}
}
