package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/edge/status"
)

// mqttPublish publishes each payload to topic at QoS 1 from one client and
// waits for every PUBACK.
func mqttPublish(t testing.TB, addr, topic string, payloads ...string) {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).
		SetClientID(fmt.Sprintf("pub-%d", time.Now().UnixNano())).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect to %s: %v", addr, tok.Error())
	}
	defer c.Disconnect(0)
	for _, p := range payloads {
		if tok := c.Publish(topic, 1, false, p); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			t.Fatalf("publish to %s: %v", topic, tok.Error())
		}
	}
}

// publishN publishes n numbered messages to topic.
func publishN(t testing.TB, addr, topic string, n int) {
	t.Helper()
	payloads := make([]string, n)
	for i := range payloads {
		payloads[i] = fmt.Sprint(i)
	}
	mqttPublish(t, addr, topic, payloads...)
}

// alarmingNode starts a node whose free-space reserve is above any disk's
// free space: it refuses every publish from the start, a real critical
// alarm (disk_reserve).
func alarmingNode(t testing.TB) *peatProc {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "peat.yaml")
	if err := os.WriteFile(cfg, []byte("storage:\n  min_free_bytes: 4000000TiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startPeat(t, filepath.Join(dir, "data"), "--config", cfg)
}

// `peat status`, `peat streams` and `peat groups` read a running node,
// by --http or PEAT_HTTP, as text or JSON.
func TestStatusCommands_AgainstARunningNode(t *testing.T) {
	p := startPeat(t, t.TempDir())
	publishN(t, p.mqttAddr, "sensors/a", 50)
	mqttPublish(t, p.mqttAddr, "$offsets/billing/default", "20")

	code, out, stderr := runPeat(t, nil, "status", "--http", p.httpAddr)
	if code != 0 {
		t.Fatalf("peat status: exit %d, want 0 without alarms\n%s%s", code, out, stderr)
	}
	for _, want := range []string{testVersion, "mqtt " + p.mqttAddr, "http " + p.httpAddr, "default", "billing", "alarms    none"} {
		if !strings.Contains(out, want) {
			t.Errorf("peat status lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "billing  default  20         30") {
		t.Errorf("peat status does not show billing at 20, 30 behind:\n%s", out)
	}

	// PEAT_HTTP instead of the flag; JSON.
	code, out, stderr = runPeat(t, []string{"PEAT_HTTP=" + p.httpAddr}, "groups", "-o", "json")
	var groups []status.Group
	if code != 0 {
		t.Fatalf("peat groups -o json: exit %d\n%s", code, stderr)
	}
	if err := json.Unmarshal([]byte(out), &groups); err != nil {
		t.Fatalf("peat groups -o json printed no JSON: %v\n%s", err, out)
	}
	if len(groups) != 1 || groups[0].Group != "billing" || groups[0].Stream != "default" ||
		groups[0].CommittedOffset == nil || *groups[0].CommittedOffset != 20 ||
		groups[0].LagRecords == nil || *groups[0].LagRecords != 30 || groups[0].LagSeconds == nil {
		t.Errorf("peat groups -o json = %s, want billing at 20, 30 behind", out)
	}

	code, out, _ = runPeat(t, nil, "streams", "-o", "json", "--http", "http://"+p.httpAddr+"/")
	var streams []status.Stream
	if err := json.Unmarshal([]byte(out), &streams); code != 0 || err != nil || len(streams) != 1 || streams[0].NextOffset != 50 {
		t.Errorf("peat streams -o json (a URL for --http): exit %d, %v\n%s", code, err, out)
	}
	code, out, _ = runPeat(t, nil, "streams", "--http", p.httpAddr)
	if code != 0 || !strings.Contains(out, "STREAM") || !strings.Contains(out, "default") {
		t.Errorf("peat streams: exit %d\n%s", code, out)
	}

	// Nobody there: exit 3, saying where it looked.
	p.stop(os.Interrupt)
	code, _, stderr = runPeat(t, nil, "status", "--http", p.httpAddr)
	if code != exitUnknown || !strings.Contains(stderr, p.httpAddr) {
		t.Errorf("peat status with the node gone: exit %d, stderr %q; want 3 naming %s", code, stderr, p.httpAddr)
	}
	if code, _, stderr := runPeat(t, nil, "groups", "-o", "yaml"); code != exitUsage || !strings.Contains(stderr, "-o must be text or json") {
		t.Errorf("peat groups -o yaml: exit %d, stderr %q; want 2", code, stderr)
	}
}

// An active alarm makes `peat status` exit non-zero, and names it.
func TestStatusCommand_ExitsNonZeroOnAnAlarm(t *testing.T) {
	p := alarmingNode(t)
	code, out, stderr := runPeat(t, nil, "status", "--http", p.httpAddr)
	if code != exitAlarm {
		t.Fatalf("peat status on a node refusing publishes: exit %d, want %d\n%s%s", code, exitAlarm, out, stderr)
	}
	if !strings.Contains(out, "CRITICAL disk_reserve: refusing publishes") {
		t.Errorf("peat status does not name the alarm:\n%s", out)
	}
	code, out, _ = runPeat(t, nil, "status", "-o", "json", "--http", p.httpAddr)
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); code != exitAlarm || err != nil || !st.Critical() || !st.Disk.Refusing {
		t.Errorf("peat status -o json: exit %d, %v, alarms %+v", code, err, st.Alarms)
	}
	code, out, _ = runPeat(t, nil, "check", "--http", p.httpAddr)
	if code != checkCritical || !strings.HasPrefix(out, "PEAT CRITICAL - disk_reserve: ") {
		t.Errorf("peat check: exit %d, %q; want 2 and a CRITICAL line", code, out)
	}
}

// peat check answers as a monitoring plugin: thresholds on group lag, one
// line with performance data, Nagios exit codes.
func TestCheck_GroupLagThresholds(t *testing.T) {
	p := startPeat(t, t.TempDir())
	publishN(t, p.mqttAddr, "sensors/a", 40)
	mqttPublish(t, p.mqttAddr, "$offsets/billing/default", "10")
	mqttPublish(t, p.mqttAddr, "$offsets/audit/default", "38")
	cases := []struct {
		args []string
		code int
		want string
	}{
		{nil, checkOK, "PEAT OK - 1 streams, 2 groups, no alarms | 'audit/default'=2;; 'billing/default'=30;;"},
		{[]string{"--max-group-lag", "100"}, checkOK, "PEAT OK"},
		{[]string{"--warn-group-lag", "20", "--max-group-lag", "100"}, checkWarning,
			"PEAT WARNING - group billing in default is 30 records behind (warn 20) | 'audit/default'=2;20;100 'billing/default'=30;20;100"},
		{[]string{"--max-group-lag", "1"}, checkCritical,
			"PEAT CRITICAL - group audit in default is 2 records behind (max 1); group billing in default is 30 records behind (max 1)"},
		{[]string{"--max-group-lag", "1", "--group", "billing"}, checkCritical,
			"PEAT CRITICAL - group billing in default is 30 records behind (max 1) | 'billing/default'=30;;1"},
		{[]string{"--max-group-behind", "1h"}, checkOK, "PEAT OK"},
		{[]string{"--group", "nobody"}, checkUnknown, `PEAT UNKNOWN - no consumer group "nobody" on this node`},
	}
	for _, tc := range cases {
		code, out, stderr := runPeat(t, nil, append([]string{"check", "--http", p.httpAddr}, tc.args...)...)
		if code != tc.code || !strings.HasPrefix(out, tc.want) {
			t.Errorf("peat check %q: exit %d, %q (stderr %q); want %d, %q", tc.args, code, out, stderr, tc.code, tc.want)
		}
	}
	if code, out, _ := runPeat(t, nil, "check", "--http", "127.0.0.1:1"); code != checkUnknown || !strings.HasPrefix(out, "PEAT UNKNOWN - ") {
		t.Errorf("peat check with no node: exit %d, %q; want 3", code, out)
	}
	if code, _, _ := runPeat(t, nil, "check", "--max-group-lag", "many"); code != checkUnknown {
		t.Errorf("peat check with a bad flag: exit %d, want 3 (2 would read as CRITICAL)", code)
	}
}

// Each operator command has its help, and the overview lists them.
func TestOpsCommands_Help(t *testing.T) {
	for _, cmd := range []string{"status", "streams", "groups", "check"} {
		for _, args := range [][]string{{"help", cmd}, {cmd, "--help"}} {
			code, out, stderr := runPeat(t, nil, args...)
			if code != 0 || stderr != "" || strings.Count(out, "Usage: peat "+cmd) != 1 || !strings.Contains(out, "\n  --http string\n") {
				t.Errorf("peat %q: exit %d, stderr %q, stdout:\n%s", args, code, stderr, out)
			}
		}
		if code, out, _ := runPeat(t, nil, "help"); code != 0 || !strings.Contains(out, "\n  peat "+cmd+" [flags]") {
			t.Errorf("peat help does not list peat %s:\n%s", cmd, out)
		}
		// A bad flag gets its one-line error, not the help's page (check
		// exits 3, UNKNOWN to a monitoring system).
		wantCode := exitUsage
		if cmd == "check" {
			wantCode = checkUnknown
		}
		if code, out, stderr := runPeat(t, nil, cmd, "--bogus"); code != wantCode || out != "" ||
			!strings.Contains(stderr, "flag provided but not defined: -bogus") {
			t.Errorf("peat %s --bogus: exit %d, stdout %q, stderr %q; want %d, the error alone", cmd, code, out, stderr, wantCode)
		}
	}
}
