package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

func TestReplay_Args(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		o, err := parseReplayArgs([]string{"sensors/#"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		want := replayOptions{broker: "127.0.0.1:1883", from: "earliest", qos: 1, idle: 2 * time.Second, filter: "sensors/#"}
		if o != want {
			t.Errorf("got %+v, want %+v", o, want)
		}
		if got, want := o.subscription(), "$replay/earliest/+/sensors/#"; got != want {
			t.Errorf("subscription = %q, want %q", got, want)
		}
	})
	t.Run("group", func(t *testing.T) {
		o, err := parseReplayArgs([]string{"--group", "audit", "--qos", "0", "meters/+/power"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := o.subscription(), "$group/audit/+/meters/+/power"; got != want {
			t.Errorf("subscription = %q, want %q", got, want)
		}
	})
	t.Run("from an RFC 3339 time", func(t *testing.T) {
		o, err := parseReplayArgs([]string{"--from", "2026-01-02T03:04:05Z", "--follow", "a"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := o.subscription(), "$replay/2026-01-02T03:04:05Z/+/a"; got != want || !o.follow {
			t.Errorf("subscription = %q follow=%v, want %q follow", got, o.follow, want)
		}
	})
	t.Run("flags after the filter", func(t *testing.T) {
		o, err := parseReplayArgs([]string{"sensors/#", "--from", "latest", "--qos", "0", "--follow"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if o.filter != "sensors/#" || o.from != "latest" || o.qos != 0 || !o.follow {
			t.Errorf("got %+v, want filter sensors/#, from latest, qos 0, follow", o)
		}
	})
	t.Run("-- ends the flags", func(t *testing.T) {
		o, err := parseReplayArgs([]string{"--from", "5", "--", "-odd/#"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if o.filter != "-odd/#" || o.from != "5" {
			t.Errorf("got %+v, want filter -odd/# from 5", o)
		}
	})
	for _, tc := range []struct {
		name, wantErr string
		args          []string
	}{
		{"two filters around a flag", "one FILTER expected", []string{"a/#", "--qos", "0", "b"}},
		{"bad flag after the filter", "--qos 2", []string{"a", "--qos", "2"}},
		{"no filter", "missing FILTER", nil},
		{"two filters", "one FILTER expected", []string{"a/#", "b"}},
		{"empty filter", "FILTER is empty", []string{""}},
		{"from and group", "exclude each other", []string{"--from", "10", "--group", "g", "a"}},
		{"from with a slash", `--from "1/2"`, []string{"--from", "1/2", "a"}},
		{"group with a wildcard", `--group "g+"`, []string{"--group", "g+", "a"}},
		{"qos 2", "--qos 2", []string{"--qos", "2", "a"}},
		{"negative count", "--count -1", []string{"--count", "-1", "a"}},
		{"unknown flag", "-bogus", []string{"--bogus", "a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseReplayArgs(tc.args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseReplayArgs(%q) = %v, want an error containing %q", tc.args, err, tc.wantErr)
			}
		})
	}
	t.Run("help", func(t *testing.T) {
		for _, args := range [][]string{{"--help"}, {"-h"}, {"sensors/#", "--help"}} {
			var out bytes.Buffer
			_, err := parseReplayArgs(args, &out)
			if !errors.Is(err, flag.ErrHelp) {
				t.Fatalf("%q: err = %v, want flag.ErrHelp", args, err)
			}
			// Flags are listed as the examples spell them: --follow.
			for _, want := range []string{"OFFSET TIMESTAMP TOPIC PAYLOAD", "0x", "\n  --follow\n", "\n  --group string\n", "\n  --idle duration\n"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("%q does not print %q:\n%s", args, want, out.String())
				}
			}
			if strings.Contains(out.String(), "\n  -follow") {
				t.Errorf("%q lists a flag with one dash:\n%s", args, out.String())
			}
		}
	})
}

func TestReplay_ExitStatusOfBadFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"replay", "--qos", "3", "a"}, &stdout, &stderr, noEnv); code != exitUsage {
		t.Errorf("peat replay --qos 3: exit %d, want %d; stderr %q", code, exitUsage, stderr.String())
	}
	if !strings.Contains(stderr.String(), "--qos 3") {
		t.Errorf("stderr %q does not name the bad flag", stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"replay", "a", "--qos", "3"}, &stdout, &stderr, noEnv); code != exitUsage || !strings.Contains(stderr.String(), "--qos 3") {
		t.Errorf("peat replay a --qos 3: exit %d, want %d; stderr %q", code, exitUsage, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"replay", "--help"}, &stdout, &stderr, noEnv); code != exitOK {
		t.Errorf("peat replay --help: exit %d, want 0", code)
	}
	if !strings.Contains(stdout.String(), "Usage: peat replay") || stderr.Len() != 0 {
		t.Errorf("peat replay --help: stdout %q, stderr %q; want the help on stdout", stdout.String(), stderr.String())
	}
}

func noEnv(string) (string, bool) { return "", false }

func TestReplay_FormatRecord(t *testing.T) {
	ts := time.Date(2026, 3, 4, 5, 6, 7, 891_000_000, time.FixedZone("CET", 3600))
	for _, tc := range []struct {
		name string
		rec  record
		want string
	}{
		{"text", record{offset: 42, timestamp: ts, topic: "sensors/a/temp", payload: []byte("21.5 °C")},
			"42 2026-03-04T04:06:07.891Z sensors/a/temp 21.5 °C\n"},
		{"no timestamp", record{offset: 0, topic: "a", payload: []byte("x")}, "0 - a x\n"},
		{"empty", record{offset: 1, timestamp: ts, topic: "a", payload: nil}, `1 2026-03-04T04:06:07.891Z a ""` + "\n"},
		{"control characters", record{offset: 2, timestamp: ts, topic: "a", payload: []byte("l1\nl2\t")}, `2 2026-03-04T04:06:07.891Z a "l1\nl2\t"` + "\n"},
		{"binary", record{offset: 3, timestamp: ts, topic: "a", payload: []byte{0xff, 0x00, 0x10}}, "3 2026-03-04T04:06:07.891Z a 0xff0010\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := formatRecord(tc.rec); got != tc.want {
				t.Errorf("formatRecord = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestReplay_ParseDelivery(t *testing.T) {
	props := func(kv ...string) *paho.PublishProperties {
		p := &paho.PublishProperties{}
		for i := 0; i < len(kv); i += 2 {
			p.User.Add(kv[i], kv[i+1])
		}
		return p
	}
	t.Run("replay", func(t *testing.T) {
		got, err := parseDelivery(&paho.Publish{
			Topic: "$replay/-15m/1234/sensors/a/temp", Payload: []byte("1"),
			Properties: props("stream", "default", "offset", "1234", "timestamp", "1767225600123"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if got.offset != 1234 || got.topic != "sensors/a/temp" || !got.timestamp.Equal(time.UnixMilli(1767225600123)) {
			t.Errorf("got %+v", got)
		}
	})
	t.Run("group without properties", func(t *testing.T) {
		got, err := parseDelivery(&paho.Publish{Topic: "$group/g/7/a/b"})
		if err != nil {
			t.Fatal(err)
		}
		if got.offset != 7 || got.topic != "a/b" || !got.timestamp.IsZero() {
			t.Errorf("got %+v", got)
		}
	})
	for _, topic := range []string{"sensors/a", "$replay/earliest/x/a", "$replay/earliest/5", "$SYS/a/1/b"} {
		if _, err := parseDelivery(&paho.Publish{Topic: topic}); err == nil {
			t.Errorf("parseDelivery(%q) succeeded, want an error", topic)
		}
	}
	if _, err := parseDelivery(&paho.Publish{Topic: "$replay/0/1/a", Properties: props("timestamp", "soon")}); err == nil {
		t.Error("a non-numeric timestamp property was accepted")
	}
}

func TestReplay_ParseSuback(t *testing.T) {
	sa := &paho.Suback{Reasons: []byte{1}, Properties: &paho.SubackProperties{}}
	sa.Properties.User.Add("stream", "default").Add("start", "5").Add("end", "120").Add("notice", "from below the log start")
	got := parseSuback(sa)
	want := subackInfo{stream: "default", start: 5, end: 120, hasStart: true, hasEnd: true, notice: "from below the log start"}
	if got.stream != want.stream || got.start != want.start || got.end != want.end || !got.hasStart || !got.hasEnd || got.notice != want.notice {
		t.Errorf("parseSuback = %+v, want %+v", got, want)
	}
	sa = &paho.Suback{Reasons: []byte{1}, Properties: &paho.SubackProperties{}}
	sa.Properties.User.Add("end", "many")
	if got := parseSuback(sa); got.hasEnd || len(got.malformedProps) != 1 {
		t.Errorf("parseSuback with end=many = %+v, want no end and one malformed property", got)
	}
}

// replayLine is one parsed output line of `peat replay`.
type replayLine struct {
	offset  uint64
	ts      time.Time
	topic   string
	payload string
}

func parseReplayLine(t testing.TB, line string) replayLine {
	t.Helper()
	f := strings.SplitN(line, " ", 4)
	if len(f) != 4 {
		t.Fatalf("line %q: want 'offset timestamp topic payload'", line)
	}
	off, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		t.Fatalf("line %q: offset: %v", line, err)
	}
	ts, err := time.Parse(time.RFC3339Nano, f[1])
	if err != nil || !strings.HasSuffix(f[1], "Z") {
		t.Fatalf("line %q: timestamp %q is not RFC 3339 in UTC: %v", line, f[1], err)
	}
	return replayLine{offset: off, ts: ts, topic: f[2], payload: f[3]}
}

// hangUpBroker listens on loopback as a broker that accepts each
// connection and CONNACKs it, then hangs up without answering the
// SUBSCRIBE. It returns its address.
func hangUpBroker(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	tb.Cleanup(func() {
		ln.Close()
		<-done
	})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 512)
			if _, err := c.Read(buf); err == nil { // the CONNECT
				_, _ = c.Write([]byte{0x20, 3, 0, 0, 0}) // CONNACK (MQTT 5): success, no properties
				time.Sleep(200 * time.Millisecond)       // the SUBSCRIBE arrives meanwhile, unanswered
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// A broker that closes the connection instead of answering the SUBSCRIBE
// makes peat replay fail saying so, not time out: its stderr says the
// connection was lost (how soon is BenchmarkReplay_BrokerHangsUp).
func TestReplay_BrokerClosingDuringSubscribeFailsAtOnce(t *testing.T) {
	code, lines, stderr := runReplayCmd(t, hangUpBroker(t), "sensors/#")
	if code != exitError || len(lines) != 0 {
		t.Fatalf("exit %d with %d lines, want %d and none; stderr:\n%s", code, len(lines), exitError, stderr)
	}
	if !strings.Contains(stderr, "lost") || strings.Contains(stderr, "deadline") {
		t.Errorf("stderr %q does not say the connection was lost", stderr)
	}
}

// BenchmarkReplay_BrokerHangsUp: how long peat replay takes to exit when
// the broker hangs up during the SUBSCRIBE (ns/op; the broker waits 200 ms
// before it hangs up, and peat replay's own timeout is 10 s).
//
//	go test -run '^$' -bench BrokerHangsUp -benchtime 5x ./cmd/peat/
func BenchmarkReplay_BrokerHangsUp(b *testing.B) {
	addr := hangUpBroker(b)
	for range b.N {
		if code, _, stderr := runReplayCmd(b, addr, "sensors/#"); code != exitError {
			b.Fatalf("exit %d, want %d; stderr:\n%s", code, exitError, stderr)
		}
	}
}

// runReplayCmd runs `peat replay ARGS` against addr to completion (at most
// 30 s) and returns its exit status, parsed lines and stderr.
func runReplayCmd(t testing.TB, addr string, args ...string) (int, []replayLine, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, append([]string{"replay", "--broker", addr}, args...)...)
	cmd.Env = cleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("peat replay %q still ran after 30 s; stdout:\n%s\nstderr:\n%s", args, stdout.String(), stderr.String())
	}
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run peat replay %q: %v", args, err)
	}
	var lines []replayLine
	for _, l := range strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n") {
		if l != "" {
			lines = append(lines, parseReplayLine(t, l))
		}
	}
	return code, lines, stderr.String()
}

// wantRecords is the expected output: topic and payload per offset.
type wantRecord struct {
	offset         uint64
	topic, payload string
}

func checkLines(t testing.TB, got []replayLine, want []wantRecord, since time.Time) {
	t.Helper()
	var g, w []string
	for _, l := range got {
		g = append(g, fmt.Sprintf("%d %s %s", l.offset, l.topic, l.payload))
		if l.ts.Before(since.Add(-time.Second)) || l.ts.After(time.Now().Add(time.Second)) {
			t.Errorf("offset %d: timestamp %v is not when it was published (after %v)", l.offset, l.ts, since)
		}
	}
	for _, r := range want {
		w = append(w, fmt.Sprintf("%d %s %s", r.offset, r.topic, r.payload))
	}
	if strings.Join(g, "\n") != strings.Join(w, "\n") {
		t.Errorf("printed records:\n%s\nwant:\n%s", strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
}

// publishSeq publishes n QoS 1 messages "<id>/<seq>" to topic and returns
// what replay must print for them, given the stream's next offset.
func publishSeq(t testing.TB, addr, id, topic string, n int, next *uint64) []wantRecord {
	t.Helper()
	p := newPublisher(t, addr, id, topic, 10)
	p.publish(n)
	if acked := p.wait(); len(acked) != n {
		t.Fatalf("publisher %s: %d of %d acknowledged", id, len(acked), n)
	}
	out := make([]wantRecord, n)
	for i := range out {
		out[i] = wantRecord{*next, topic, payloadOf(id, i)}
		*next++
	}
	return out
}

func TestReplay_AgainstANode(t *testing.T) {
	since := time.Now()
	p := startPeat(t, t.TempDir())
	t.Cleanup(func() { // a failure shows the broker's log and goroutines
		if t.Failed() {
			_ = p.cmd.Process.Signal(syscall.SIGQUIT)
			<-p.exited
			t.Log(p.log())
		}
	})
	var next uint64
	a := publishSeq(t, p.mqttAddr, "a", "sensors/a", 20, &next)      // offsets 0-19
	_ = publishSeq(t, p.mqttAddr, "o", "other/x", 5, &next)          // 20-24, not matched
	b := publishSeq(t, p.mqttAddr, "b", "sensors/b/temp", 10, &next) // 25-34
	all := append(append([]wantRecord(nil), a...), b...)

	t.Run("from earliest prints every record once, in order, and stops at the end", func(t *testing.T) {
		// --idle 0: it must stop because it reached the end of the history.
		code, lines, stderr := runReplayCmd(t, p.mqttAddr, "--from", "earliest", "--idle", "0", "sensors/#")
		if code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr)
		}
		checkLines(t, lines, all, since)
	})
	t.Run("from an offset", func(t *testing.T) {
		code, lines, stderr := runReplayCmd(t, p.mqttAddr, "--from", "15", "--idle", "0", "sensors/#")
		if code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr)
		}
		checkLines(t, lines, all[15:], since)
	})
	t.Run("count", func(t *testing.T) {
		code, lines, stderr := runReplayCmd(t, p.mqttAddr, "--from", "18", "--count", "3", "sensors/#")
		if code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr)
		}
		checkLines(t, lines, all[18:21], since)
	})
	t.Run("idle ends a filter whose last match is before the end", func(t *testing.T) {
		code, lines, stderr := runReplayCmd(t, p.mqttAddr, "--idle", "300ms", "sensors/a")
		if code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr)
		}
		checkLines(t, lines, a, since)
	})
	t.Run("from latest prints nothing and exits", func(t *testing.T) {
		code, lines, stderr := runReplayCmd(t, p.mqttAddr, "--from", "latest", "--idle", "0", "sensors/#")
		if code != 0 || len(lines) != 0 {
			t.Fatalf("exit %d, %d lines, stderr:\n%s", code, len(lines), stderr)
		}
	})
	t.Run("a refused subscription exits 1 with the broker's reason", func(t *testing.T) {
		code, lines, stderr := runReplayCmd(t, p.mqttAddr, "--from", "bogus", "sensors/#")
		if code != exitError || len(lines) != 0 {
			t.Fatalf("exit %d with %d lines, want exit %d and none; stderr:\n%s", code, len(lines), exitError, stderr)
		}
		if !strings.Contains(stderr, "refused") || !strings.Contains(stderr, "bogus") {
			t.Errorf("stderr %q does not say the subscription was refused and why", stderr)
		}
	})
	t.Run("group resumes where the previous run stopped", func(t *testing.T) {
		code, first, stderr := runReplayCmd(t, p.mqttAddr, "--group", "g1", "--count", "12", "sensors/#")
		if code != 0 {
			t.Fatalf("first run: exit %d, stderr:\n%s", code, stderr)
		}
		checkLines(t, first, all[:12], since)
		code, rest, stderr := runReplayCmd(t, p.mqttAddr, "--group", "g1", "--idle", "0", "sensors/#")
		if code != 0 {
			t.Fatalf("second run: exit %d, stderr:\n%s", code, stderr)
		}
		checkLines(t, rest, all[12:], since)
		code, none, stderr := runReplayCmd(t, p.mqttAddr, "--group", "g1", "--idle", "0", "sensors/#")
		if code != 0 || len(none) != 0 {
			t.Fatalf("third run: exit %d with %d lines, want 0 and none (all consumed); stderr:\n%s", code, len(none), stderr)
		}
	})
	t.Run("follow prints new records until interrupted", func(t *testing.T) {
		cmd := exec.Command(binPath, "replay", "--broker", p.mqttAddr, "--from", "30", "--follow", "sensors/#")
		cmd.Env = cleanEnv()
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		lines := make(chan string)
		go func() { // ends when the process closes stdout
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		read := func(n int) []replayLine {
			var got []replayLine
			for len(got) < n {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("peat replay --follow closed its output after %d lines", len(got))
					}
					got = append(got, parseReplayLine(t, l))
				case <-time.After(20 * time.Second):
					t.Fatalf("peat replay --follow printed %d lines in 20 s, want %d", len(got), n)
				}
			}
			return got
		}
		checkLines(t, read(5), all[25:], since) // offsets 30-34: the end of the history, where it goes on
		c := publishSeq(t, p.mqttAddr, "c", "sensors/c", 5, &next)
		checkLines(t, read(5), c, since)
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		for l := range lines {
			t.Errorf("unexpected line after the interrupt: %q", l)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("peat replay --follow after Ctrl-C: %v, want exit 0; stderr:\n%s", err, stderr.String())
		}
	})
}

// TestReplay_GroupInterruptedMidStream interrupts a group consumer while it
// prints a backlog: the next run must print exactly the records the first
// one did not, as a group commits only what was printed.
func TestReplay_GroupInterruptedMidStream(t *testing.T) {
	since := time.Now()
	p := startPeat(t, t.TempDir())
	var next uint64
	want := publishSeq(t, p.mqttAddr, "d", "bulk/d", 3000, &next)

	cmd := exec.Command(binPath, "replay", "--broker", p.mqttAddr, "--group", "g", "--follow", "bulk/#")
	cmd.Env = cleanEnv()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var first []replayLine
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		first = append(first, parseReplayLine(t, sc.Text()))
		if len(first) == 100 { // interrupt mid-stream
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("interrupted peat replay --group: %v, want exit 0; stderr:\n%s", err, stderr.String())
	}
	if len(first) < 100 || len(first) >= len(want) {
		t.Fatalf("first run printed %d lines, want at least 100 and fewer than %d", len(first), len(want))
	}
	checkLines(t, first, want[:len(first)], since)

	code, rest, errOut := runReplayCmd(t, p.mqttAddr, "--group", "g", "--idle", "0", "bulk/#")
	if code != 0 {
		t.Fatalf("second run: exit %d, stderr:\n%s", code, errOut)
	}
	checkLines(t, rest, want[len(first):], since)
}
