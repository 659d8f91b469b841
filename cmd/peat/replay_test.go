package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
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
	for _, tc := range []struct {
		name, wantErr string
		args          []string
	}{
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
		var stderr bytes.Buffer
		_, err := parseReplayArgs([]string{"--help"}, &stderr)
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("--help: err = %v, want flag.ErrHelp", err)
		}
		for _, want := range []string{"OFFSET TIMESTAMP TOPIC PAYLOAD", "0x", "-follow", "-group", "-idle"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("--help does not mention %q:\n%s", want, stderr.String())
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
	if code := run([]string{"replay", "--help"}, &stdout, &stderr, noEnv); code != exitOK {
		t.Errorf("peat replay --help: exit %d, want 0", code)
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
