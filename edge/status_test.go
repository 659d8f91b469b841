package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/edge/status"
)

// commitOffset publishes a group commit ($offsets/<group>/<stream>) at QoS
// 1 and waits for its PUBACK: the group then exists with that offset.
func commitOffset(tb testing.TB, n *Node, group, stream string, off uint64) {
	tb.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).
		SetClientID(fmt.Sprintf("commit-%d", time.Now().UnixNano())).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		tb.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	tok := c.Publish("$offsets/"+group+"/"+stream, 1, false, fmt.Sprint(off))
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		tb.Fatalf("commit %d to %s/%s: %v", off, group, stream, tok.Error())
	}
}

func getStatus(tb testing.TB, n *Node) status.Status {
	tb.Helper()
	code, ctype, body := get(tb, "GET", "http://"+n.HTTPAddr().String()+"/api/v1/status")
	if code != 200 || ctype != "application/json" {
		tb.Fatalf("GET /api/v1/status = %d %s %s", code, ctype, body)
	}
	var st status.Status
	if err := json.Unmarshal(body, &st); err != nil {
		tb.Fatalf("decode /api/v1/status: %v\n%s", err, body)
	}
	return st
}

// The status document shows what was published, the group's lag in
// records and time, and the node's own facts.
func TestNode_StatusAPI(t *testing.T) {
	cfg := testConfig(t)
	cfg.Streams[0].Retention.MaxBytes = 64 << 20
	n := startNode(t, cfg)
	n.SetBuild(Build{Version: "v1.2.3", Commit: "abc1234"})
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 40)
	commitOffset(t, n, "billing", "default", 30)

	st := getStatus(t, n)
	if st.Node.Version != "v1.2.3" || st.Node.Commit != "abc1234" || st.Node.UptimeSeconds <= 0 || st.Node.ID == "" {
		t.Errorf("node = %+v, want the build set, an id and an uptime", st.Node)
	}
	if len(st.Listeners) != 2 || st.Listeners[0].Address != n.MQTTAddr().String() || st.Listeners[1].Address != n.HTTPAddr().String() {
		t.Errorf("listeners = %+v, want mqtt %v and http %v", st.Listeners, n.MQTTAddr(), n.HTTPAddr())
	}
	if len(st.Streams) != 1 {
		t.Fatalf("streams = %+v, want default only", st.Streams)
	}
	s := st.Streams[0]
	if s.Name != "default" || s.NextOffset != 40 || s.Records != 40 || s.Bytes <= 0 ||
		s.OldestAgeSeconds == nil || *s.OldestAgeSeconds > 600 || s.Retention.MaxBytes != 64<<20 || s.Retention.MaxAgeSeconds != 7*24*3600 {
		t.Errorf("stream = %+v", s)
	}
	if len(st.Groups) != 1 {
		t.Fatalf("groups = %+v, want billing", st.Groups)
	}
	g := st.Groups[0]
	if g.Group != "billing" || g.Stream != "default" || g.CommittedOffset == nil || *g.CommittedOffset != 30 ||
		g.LagRecords == nil || *g.LagRecords != 10 || g.LagSeconds == nil || *g.LagSeconds > 600 || g.Consumer != "" {
		t.Errorf("group = %+v, want billing in default at 30, 10 behind, no consumer", g)
	}
	if len(st.Alarms) != 0 || st.Disk.Refusing || !st.Disk.Known {
		t.Errorf("alarms %+v, disk %+v: want none on a roomy disk", st.Alarms, st.Disk)
	}

	code, _, body := get(t, "GET", "http://"+n.HTTPAddr().String()+"/api/v1/groups")
	var groups []status.Group
	if err := json.Unmarshal(body, &groups); code != 200 || err != nil || len(groups) != 1 || *groups[0].LagRecords != 10 {
		t.Errorf("GET /api/v1/groups = %d %s (%v), want billing 10 behind", code, body, err)
	}

	// The consumer catches up: the lag is gone.
	commitOffset(t, n, "billing", "default", 40)
	if g := getStatus(t, n).Groups[0]; *g.LagRecords != 0 || *g.LagSeconds != 0 {
		t.Errorf("after committing the end: group = %+v, want no lag", g)
	}
}

// Group lag and the build are on /metrics; per-client series are not.
func TestNode_GroupAndBuildMetrics(t *testing.T) {
	n := startNode(t, testConfig(t))
	n.SetBuild(Build{Version: "v1.2.3", Commit: "abc1234"})
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 12)
	commitOffset(t, n, "audit", "default", 5)
	_, _, body := get(t, "GET", "http://"+n.HTTPAddr().String()+"/metrics")
	text := string(body)
	for _, want := range []string{
		`peat_group_lag_records{group="audit",stream="default"} 7`,
		`peat_group_consumer_connected{group="audit",stream="default"} 0`,
		`peat_build_info{commit="abc1234",goversion="`,
		`peat_log_next_offset{stream="default"} 12`,
		`peat_disk_free_bytes{dir="`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(text, "client=") || strings.Contains(text, "client_id=") {
		t.Errorf("/metrics has per-client series")
	}
}

// Free space below the reserve is a critical alarm, in the document and
// on the page, and goes away when space returns.
func TestNode_StatusAlarmForDiskReserve(t *testing.T) {
	n, err := New(testConfig(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var free atomic.Uint64
	free.Store(100 * gib)
	n.freeSpace = func(string) (uint64, uint64, error) { return free.Load(), 200 * gib, nil }
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })

	if st := getStatus(t, n); len(st.Alarms) != 0 {
		t.Fatalf("alarms = %+v, want none with 100 GiB free", st.Alarms)
	}
	free.Store(1 << 20)
	var st status.Status
	deadline := time.Now().Add(10 * time.Second)
	for st = getStatus(t, n); len(st.Alarms) == 0 && time.Now().Before(deadline); st = getStatus(t, n) {
		time.Sleep(50 * time.Millisecond) // the free-space figure is cached for 100 ms
	}
	if len(st.Alarms) != 1 || st.Alarms[0].ID != status.AlarmDiskReserve || st.Alarms[0].Severity != status.SeverityCritical ||
		!strings.Contains(st.Alarms[0].Message, "refusing publishes") || !st.Disk.Refusing {
		t.Fatalf("alarms = %+v, disk %+v: want one critical disk_reserve", st.Alarms, st.Disk)
	}
	_, _, page := get(t, "GET", "http://"+n.HTTPAddr().String()+"/")
	if !strings.Contains(string(page), `data-alarm="disk_reserve"`) || !strings.Contains(string(page), "refusing publishes") {
		t.Errorf("the page does not show the alarm:\n%s", page)
	}
	free.Store(100 * gib)
	deadline = time.Now().Add(10 * time.Second)
	for st = getStatus(t, n); len(st.Alarms) != 0 && time.Now().Before(deadline); st = getStatus(t, n) {
		time.Sleep(50 * time.Millisecond)
	}
	if len(st.Alarms) != 0 {
		t.Errorf("alarms = %+v after space returned, want none", st.Alarms)
	}
}

// The page has every value in its HTML, and its assets, before any
// script runs.
func TestNode_StatusPageRendersWithoutScript(t *testing.T) {
	n := startNode(t, testConfig(t))
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 1234)
	commitOffset(t, n, "billing", "default", 200)
	base := "http://" + n.HTTPAddr().String()
	code, ctype, body := get(t, "GET", base+"/")
	page := string(body)
	if code != 200 || !strings.HasPrefix(ctype, "text/html") {
		t.Fatalf("GET / = %d %s", code, ctype)
	}
	for _, want := range []string{
		`<tr data-stream="default"><td>default</td>`,
		`data-field="next_offset">1,234<`,
		`<tr data-group="billing" data-stream="default">`,
		`data-field="lag_records">1,034<`,
		`<svg class="spark" data-spark="published"`,
		"No alarms.",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("GET / lacks %s", want)
		}
	}
	for _, asset := range []string{"/assets/status.css", "/assets/status.js"} {
		if code, _, body := get(t, "GET", base+asset); code != 200 || len(body) == 0 {
			t.Errorf("GET %s = %d, %d bytes", asset, code, len(body))
		}
	}
	if code, _, _ := get(t, "GET", base+"/assets/page.html"); code != 404 {
		t.Errorf("GET /assets/page.html = %d, want 404 (the template is no asset)", code)
	}
}

// A durable session that is away counts, with how far behind it is.
func TestNode_StatusCountsDurableSessions(t *testing.T) {
	n := startNode(t, testConfig(t))
	got := make(chan struct{}, 100)
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).
		SetClientID("field-logger").SetCleanSession(false).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	if tok := c.Subscribe("sensors/#", 1, func(paho.Client, paho.Message) { got <- struct{}{} }); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 3)
	for range 3 {
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatal("the durable subscriber got no delivery")
		}
	}
	if s := getStatus(t, n).Sessions; s.Durable != 1 || s.Connected != 1 {
		t.Errorf("sessions = %+v while connected, want 1 durable, 1 connected", s)
	}
	c.Disconnect(100)
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 5)

	deadline := time.Now().Add(30 * time.Second)
	var s status.Sessions
	for {
		s = getStatus(t, n).Sessions
		if s.Connected == 0 && s.MaxLagRecords == 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s.Durable != 1 || s.Connected != 0 || s.MaxLagRecords != 5 || s.MaxLagClient != "field-logger" || s.MaxLagStream != "default" {
		t.Errorf("sessions = %+v, want field-logger away and 5 behind in default", s)
	}
}
