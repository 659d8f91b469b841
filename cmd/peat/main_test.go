package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestVersion(t *testing.T) {
	code, stdout, _ := runPeat(t, nil, "version")
	if code != 0 {
		t.Fatalf("peat version exited %d", code)
	}
	if !strings.Contains(stdout, testVersion) || !strings.Contains(stdout, testCommit) {
		t.Errorf("peat version printed %q, want version %s and commit %s", stdout, testVersion, testCommit)
	}
}

// Help goes to stdout with exit 0, and lists flags as the README and the
// examples spell them (--mqtt, not -mqtt).
func TestHelp(t *testing.T) {
	serveFlags := []string{"\n  --mqtt string\n", "\n  --data string\n", "\n  --config string\n"}
	replayFlags := []string{"\n  --from string\n", "\n  --follow\n", "\n  --group string\n"}
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"help"}, append(append([]string{"peat serve", "peat replay"}, serveFlags...), replayFlags...)},
		{[]string{"--help"}, append(append([]string{"peat serve"}, serveFlags...), replayFlags...)},
		{[]string{"help", "serve"}, append([]string{"Usage: peat serve"}, serveFlags...)},
		{[]string{"serve", "--help"}, append([]string{"Usage: peat serve"}, serveFlags...)},
		{[]string{"serve", "-h"}, serveFlags},
		{[]string{"help", "replay"}, append([]string{"Usage: peat replay"}, replayFlags...)},
		{[]string{"replay", "--help"}, append([]string{"Usage: peat replay"}, replayFlags...)},
		{[]string{"replay", "sensors/#", "--help"}, replayFlags},
		{[]string{"help", "version"}, []string{"Usage: peat version"}},
	}
	for _, tc := range cases {
		code, stdout, stderr := runPeat(t, nil, tc.args...)
		if code != 0 || stderr != "" {
			t.Errorf("peat %q: exit %d, stderr %q; want 0 and nothing on stderr", tc.args, code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout, w) {
				t.Errorf("peat %q: stdout does not have %q:\n%s", tc.args, w, stdout)
			}
		}
		if n := strings.Count(stdout, "Usage: peat"); n > 1 {
			t.Errorf("peat %q printed its help %d times:\n%s", tc.args, n, stdout)
		}
		if strings.Contains(stdout, "\n  -mqtt") || strings.Contains(stdout, "\n  -from") {
			t.Errorf("peat %q lists flags with one dash:\n%s", tc.args, stdout)
		}
	}
	code, _, stderr := runPeat(t, nil, "help", "frobnicate")
	if code != 2 || !strings.Contains(stderr, `unknown command "frobnicate"`) {
		t.Errorf("peat help frobnicate: exit %d, stderr %q; want 2 naming it", code, stderr)
	}
}

// Flags may follow the filter, as in `peat replay 'sensors/#' --from
// earliest` (Go's flag package alone stops at the filter).
func TestReplay_FlagsAfterTheFilter(t *testing.T) {
	// Nothing listens on this port: the command gets past its flags and
	// fails to connect (exit 1), where misread flags would exit 2.
	code, _, stderr := runPeat(t, nil, "replay", "sensors/#", "--from", "earliest", "--broker", "127.0.0.1:1", "--idle", "0s")
	if code != exitError || !strings.Contains(stderr, "connect to 127.0.0.1:1") {
		t.Errorf("peat replay FILTER --from earliest --broker 127.0.0.1:1: exit %d, stderr %q; want 1 and a connect error", code, stderr)
	}
}

// Every way of getting the command line or the config wrong exits with
// status 2 and says which field is wrong and why, on stderr.
func TestServe_InvalidInputExits2NamingTheField(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	badDurability := write("durability.yaml", "streams:\n  - name: a\n    filters: [\"#\"]\n    durability: sometimes\n")
	unknownField := write("unknown.yaml", "mqtt:\n  listen: 127.0.0.1:0\n  windw: 10\n")
	wrongType := write("type.yaml", "mqtt: {window: many}\n")
	twoProblems := write("two.yaml", "log: {level: loud}\nstorage: {profile: laptop}\n")

	cases := []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"unknown command", nil, []string{"frobnicate"}, []string{`unknown command "frobnicate"`}},
		{"no command", nil, nil, []string{"Usage"}},
		{"unknown flag", nil, []string{"serve", "--bogus"}, []string{"-bogus"}},
		{"flag without value", nil, []string{"serve", "--data"}, []string{"-data"}},
		{"stray argument", nil, []string{"serve", "extra"}, []string{`"extra"`}},
		{"bad --mqtt", nil, []string{"serve", "--mqtt", "localhost"}, []string{"mqtt.listen (from flag --mqtt)", "host:port"}},
		{"bad --http", nil, []string{"serve", "--http", "127.0.0.1:70000"}, []string{"http.listen (from flag --http)", "port"}},
		{"empty --data", nil, []string{"serve", "--data", ""}, []string{"data_dir (from flag --data)", "empty"}},
		{"bad --profile", nil, []string{"serve", "--profile", "laptop"}, []string{"storage.profile (from flag --profile)", `"laptop"`}},
		{"bad env", []string{"PEAT_LOG_LEVEL=loud"}, []string{"serve"}, []string{"log.level (from PEAT_LOG_LEVEL)", `"loud"`}},
		{"missing config file", nil, []string{"serve", "--config", filepath.Join(dir, "nope.yaml")}, []string{"nope.yaml"}},
		{"bad durability", nil, []string{"serve", "--config", badDurability}, []string{"streams[0].durability", `"sometimes"`}},
		{"unknown field", nil, []string{"serve", "--config", unknownField}, []string{"mqtt.windw (line 3): unknown field"}},
		{"wrong type", nil, []string{"serve", "--config", wrongType}, []string{"mqtt.window (line 1)", `"many"`}},
		{"config via env", []string{"PEAT_CONFIG=" + wrongType}, []string{"serve"}, []string{"mqtt.window (line 1)"}},
		{"every problem", nil, []string{"serve", "--config", twoProblems}, []string{"2 problems", "log.level", "storage.profile"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runPeat(t, tc.env, tc.args...)
			if code != 2 {
				t.Errorf("exit status %d, want 2; stderr:\n%s", code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// A port that is taken is not a config error: exit 1, saying what failed.
func TestServe_PortInUseExits1(t *testing.T) {
	p := startPeat(t, t.TempDir())
	code, _, stderr := runPeat(t, nil, "serve", "--data", t.TempDir(), "--mqtt", p.mqttAddr, "--http", "127.0.0.1:0")
	if code != 1 || !strings.Contains(stderr, p.mqttAddr) {
		t.Errorf("second peat on MQTT %s: exit %d, want 1 and the address on stderr:\n%s", p.mqttAddr, code, stderr)
	}
}

// SIGTERM and SIGINT stop the node cleanly (exit 0, logged), and what was
// acknowledged is there after a restart, at the same offsets.
func TestServe_SignalShutsDownCleanlyAndKeepsData(t *testing.T) {
	data := t.TempDir()
	const n = 200
	total := 0
	for i, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		p := startPeat(t, data)
		if got := p.stream("default").NextOffset; got != uint64(total) {
			t.Fatalf("start %d: next_offset %d, want %d (the messages acknowledged before)", i, got, total)
		}
		pub := newPublisher(t, p.mqttAddr, "sig-"+sig.String(), "keep/"+sig.String(), 16)
		pub.publish(n)
		if acked := len(pub.wait()); acked != n {
			t.Fatalf("%d of %d publishes acknowledged", acked, n)
		}
		total += n
		if code := p.stop(sig); code != 0 {
			t.Fatalf("exit status %d after %v, want 0\n%s", code, sig, p.log())
		}
		for _, w := range []string{`"shutting down"`, `"signal":"` + sig.String(), `"msg":"stopped"`} {
			if !strings.Contains(p.log(), w) {
				t.Errorf("log after %v does not say %s:\n%s", sig, w, p.log())
			}
		}
	}
	recs := readLog(t, data, "default")
	if len(recs) != total {
		t.Fatalf("log holds %d records, want %d", len(recs), total)
	}
	p := startPeat(t, data)
	if s := p.stream("default"); s.NextOffset != uint64(total) || s.CommittedOffset != uint64(total) || s.FirstOffset != 0 {
		t.Errorf("after restart: %+v, want first 0, next and committed %d", s, total)
	}
}
