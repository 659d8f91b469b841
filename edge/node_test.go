package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/logstore"
)

// testConfig is a node on loopback ports chosen by the kernel, with its data
// in a fresh directory and the server profile (no memory limit: tests share
// one process).
func testConfig(tb testing.TB) Config {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = tb.TempDir()
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Storage.Profile = string(logstore.ProfileServer)
	return cfg
}

// startNode starts a node and closes it at cleanup.
func startNode(tb testing.TB, cfg Config) *Node {
	tb.Helper()
	n, err := New(cfg, nil)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	if err := n.Start(context.Background()); err != nil {
		tb.Fatalf("Start: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return n
}

// publishQoS1 publishes n QoS 1 messages from one client and waits for
// every PUBACK.
func publishQoS1(tb testing.TB, addr net.Addr, topic string, n int) {
	tb.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr.String()).
		SetClientID(fmt.Sprintf("pub-%d", time.Now().UnixNano())).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		tb.Fatalf("connect to %v: %v", addr, tok.Error())
	}
	defer c.Disconnect(0)
	toks := make([]paho.Token, n)
	for i := range toks {
		toks[i] = c.Publish(topic, 1, false, fmt.Sprintf("m%d", i))
	}
	for i, tok := range toks {
		if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			tb.Fatalf("publish %d to %s: %v", i, topic, tok.Error())
		}
	}
}

// get returns the status, content type and body of a request to url,
// sent as `peat` sends it (a change as JSON).
func get(tb testing.TB, method, url string) (int, string, []byte) {
	tb.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), body
}

func TestNode_HTTP(t *testing.T) {
	cfg := testConfig(t)
	cfg.Streams = append(cfg.Streams, defaultStream("telemetry", "sensors/#", "meters/+/power"))
	n := startNode(t, cfg)
	base := "http://" + n.HTTPAddr().String()
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 25)
	publishQoS1(t, n.MQTTAddr(), "other", 3)

	t.Run("healthz", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, _, body := get(t, "GET", base+path); code != 200 || strings.TrimSpace(string(body)) != "ok" {
				t.Errorf("GET %s = %d %q, want 200 ok", path, code, body)
			}
		}
	})

	t.Run("streams", func(t *testing.T) {
		code, ctype, body := get(t, "GET", base+"/api/v1/streams")
		if code != 200 || ctype != "application/json" {
			t.Fatalf("GET /api/v1/streams = %d %s %s", code, ctype, body)
		}
		var raw []map[string]any
		if err := json.Unmarshal(body, &raw); err != nil {
			t.Fatalf("not a JSON array of objects: %v\n%s", err, body)
		}
		wantKeys := []string{"bytes", "committed_offset", "filters", "first_offset", "name", "next_offset"}
		for _, obj := range raw {
			keys := make([]string, 0, len(obj))
			for k := range obj {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, wantKeys) {
				t.Errorf("stream object keys %v, want %v", keys, wantKeys)
			}
		}
		var got []StreamInfo
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 {
			t.Fatalf("got %d streams, want 2: %s", len(got), body)
		}
		byName := map[string]StreamInfo{got[0].Name: got[0], got[1].Name: got[1]}
		tel, def := byName["telemetry"], byName["default"]
		if tel.NextOffset != 25 || tel.CommittedOffset != 25 || tel.FirstOffset != 0 || tel.Bytes <= 0 ||
			!reflect.DeepEqual(tel.Filters, []string{"sensors/#", "meters/+/power"}) {
			t.Errorf("telemetry = %+v, want 25 records from 0, its filters, some bytes", tel)
		}
		if def.NextOffset != 3 || !reflect.DeepEqual(def.Filters, []string{"#"}) {
			t.Errorf("default = %+v, want 3 records and filter #", def)
		}

		code, _, body = get(t, "GET", base+"/api/v1/streams/telemetry")
		var one StreamInfo
		if code != 200 || json.Unmarshal(body, &one) != nil || one.NextOffset != 25 {
			t.Errorf("GET /api/v1/streams/telemetry = %d %s", code, body)
		}
	})

	t.Run("errors are JSON", func(t *testing.T) {
		for _, tc := range []struct {
			method, path string
			code         int
			word         string
		}{
			{"GET", "/api/v1/streams/nope", 404, `"nope"`},
			{"GET", "/api/v2/whatever", 404, "/api/v2/whatever"},
			{"POST", "/api/v1/streams", 405, "POST"},
			{"PUT", "/api/v1/streams/default", 405, "PUT"},
			{"DELETE", "/api/v1/streams/default", 409, "remove it from streams:"},
			{"DELETE", "/api/v1/streams/nope", 404, `"nope"`},
		} {
			code, ctype, body := get(t, tc.method, base+tc.path)
			var e struct{ Error string }
			if code != tc.code || ctype != "application/json" || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error, tc.word) {
				t.Errorf("%s %s = %d %s %q, want %d with a JSON error mentioning %s", tc.method, tc.path, code, ctype, body, tc.code, tc.word)
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		code, _, body := get(t, "GET", base+"/metrics")
		if code != 200 {
			t.Fatalf("GET /metrics = %d", code)
		}
		text := string(body)
		for _, want := range []string{
			`peat_log_appended_records_total{stream="telemetry"} 25`,
			`peat_log_appended_records_total{stream="default"} 3`,
			`peat_log_appended_bytes_total{stream="telemetry"}`,
			`peat_log_append_duration_seconds_bucket{stream="telemetry"`,
			`peat_log_commit_duration_seconds_bucket`,
			`peat_log_next_offset{stream="telemetry"} 25`,
			`peat_log_committed_offset{stream="default"} 3`,
			`peat_mqtt_received_messages_total{stream="telemetry"} 25`,
			`peat_mqtt_connected_clients`,
			`peat_mqtt_delivered_records_total`,
			`go_goroutines`,
			`go_memstats_heap_alloc_bytes`,
		} {
			if !strings.Contains(text, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})
}

func TestNode_Lifecycle(t *testing.T) {
	cfg := testConfig(t)
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n.MQTTAddr() != nil || n.HTTPAddr() != nil || n.Store() != nil {
		t.Error("a node that is not started reports addresses or a store")
	}
	ctx := context.Background()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start = %v, want ErrStarted", err)
	}
	httpAddr := n.HTTPAddr().String()
	for range 2 {
		if err := n.Close(ctx); err != nil {
			t.Errorf("Close = %v", err)
		}
	}
	if err := n.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
	if _, err := http.Get("http://" + httpAddr + "/healthz"); err == nil {
		t.Error("HTTP still answers after Close")
	}
	if n.MQTTAddr() != nil || n.HTTPAddr() != nil || n.Store() != nil {
		t.Error("a closed node reports addresses or a store")
	}
	// The data directory is free again (Badger's lock released).
	cfg.MQTT.Listen, cfg.HTTP.Listen = "127.0.0.1:0", ""
	m := startNode(t, cfg)
	if m.HTTPAddr() != nil {
		t.Errorf("HTTPAddr with HTTP off = %v, want nil", m.HTTPAddr())
	}

	// Close of a node never started is fine.
	idle, err := New(testConfig(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Close(ctx); err != nil {
		t.Errorf("Close of an unstarted node = %v", err)
	}
}

func TestNode_RestartKeepsOffsets(t *testing.T) {
	cfg := testConfig(t)
	n := startNode(t, cfg)
	publishQoS1(t, n.MQTTAddr(), "a/b", 40)
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := startNode(t, cfg)
	publishQoS1(t, m.MQTTAddr(), "a/b", 2)
	s := m.Store().Stream("default")
	if s.NextOffset() != 42 || s.FirstOffset() != 0 {
		t.Errorf("after restart and 2 more: first %d next %d, want 0 and 42", s.FirstOffset(), s.NextOffset())
	}
	recs, err := s.Read(40, 10, 1<<20)
	if err != nil || len(recs) != 2 || recs[0].Offset != 40 || string(recs[1].Payload) != "m1" {
		t.Errorf("records after restart: %v %v", recs, err)
	}
}

// A failed Start releases what it opened: the same data directory and HTTP
// port can be used right after.
func TestNode_StartFailureReleasesEverything(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := testConfig(t)
	cfg.MQTT.Listen = taken.Addr().String()
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = n.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), taken.Addr().String()) {
		t.Fatalf("Start on a taken MQTT port = %v, want an error naming %s", err, taken.Addr())
	}
	if err := n.Close(context.Background()); err != nil {
		t.Errorf("Close after a failed Start = %v", err)
	}
	cfg.MQTT.Listen = "127.0.0.1:0"
	startNode(t, cfg)
}

func TestNew_RejectsInvalidConfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.Streams[0].Durability = "never"
	if _, err := New(cfg, nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "streams[0].durability") {
		t.Errorf("New with a bad durability = %v, want ErrConfig naming streams[0].durability", err)
	}
}

func TestNode_MemoryLimitFollowsTheProfile(t *testing.T) {
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		t.Skip("GOMEMLIMIT is set: the node leaves the limit to it")
	}
	before := debug.SetMemoryLimit(-1)
	cfg := testConfig(t)
	cfg.Storage.Profile = string(logstore.ProfilePiZero)
	n := startNode(t, cfg)
	if got, want := debug.SetMemoryLimit(-1), logstore.ProfilePiZero.MemoryLimit(); got != want {
		t.Errorf("memory limit with pi-zero = %d, want %d", got, want)
	}
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Errorf("memory limit after Close = %d, want it restored to %d", got, before)
	}
}

// On one CPU a node whose commits wait for fsync runs with two Ps, so that
// clients are served while a commit blocks in fdatasync (applyProcs); with
// interval durability it keeps one. Close gives the setting back.
func TestNode_OneCPUGetsASecondPOnlyForFsyncCommits(t *testing.T) {
	if _, ok := os.LookupEnv("GOMAXPROCS"); ok {
		t.Skip("GOMAXPROCS is set: the node leaves it alone")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // as on a one-CPU machine
	for _, tc := range []struct {
		durability logstore.Durability
		want       int
	}{
		{logstore.DurabilityFsync, 2},
		{logstore.DurabilityInterval, 1},
	} {
		cfg := testConfig(t)
		cfg.Streams[0].Durability = string(tc.durability)
		n := startNode(t, cfg)
		if got := runtime.GOMAXPROCS(0); got != tc.want {
			t.Errorf("%s: GOMAXPROCS = %d while serving, want %d", tc.durability, got, tc.want)
		}
		if err := n.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := runtime.GOMAXPROCS(0); got != 1 {
			t.Errorf("%s: GOMAXPROCS = %d after Close, want 1 again", tc.durability, got)
		}
	}
}

func TestStoreLog_RouteReturnsANilInterface(t *testing.T) {
	sc := logstore.DefaultConfig()
	sc.InMemory, sc.Dir = true, ""
	sc.Streams[0].Filters = []string{"sensors/#"}
	st, err := logstore.Open(sc)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l := storeLog{st}
	if s := l.Route("other/topic"); s != nil {
		t.Errorf("Route of an uncaptured topic = %#v, want a nil interface", s)
	}
	if s := l.Route("sensors/a"); s == nil || s.Name() != "default" {
		t.Errorf("Route(sensors/a) = %v, want stream default", s)
	}
	if ss := l.Streams(); len(ss) != 1 || ss[0].Name() != "default" {
		t.Errorf("Streams() = %v", ss)
	}
}
