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

func TestHelp(t *testing.T) {
	code, stdout, _ := runPeat(t, nil, "help")
	if code != 0 || !strings.Contains(stdout, "peat serve") {
		t.Errorf("peat help: exit %d, output %q", code, stdout)
	}
	code, _, stderr := runPeat(t, nil, "serve", "--help")
	if code != 0 || !strings.Contains(stderr, "-mqtt") || !strings.Contains(stderr, "-data") {
		t.Errorf("peat serve --help: exit %d, output %q", code, stderr)
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
