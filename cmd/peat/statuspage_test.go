package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	paho "github.com/eclipse/paho.mqtt.golang"
)

// chromiumPath is Debian's chromium, which scripts/test-deps.sh installs.
const chromiumPath = "/usr/bin/chromium"

// screenshotEnv names a file to copy the status page's screenshot to (the
// README's picture: scripts/bench-results/status-page.png). With it, the
// test also publishes for 15 s first, so the sparklines have points.
const screenshotEnv = "PEAT_STATUS_SCREENSHOT"

// syncBuffer collects the browser's output for a failure message.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startBrowser starts a headless chromium for the test, or fails the test
// saying why: a browser test that cannot run must not pass.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("the status page test needs Debian's chromium at %s (scripts/test-deps.sh installs it): %v", chromiumPath, err)
	}
	out := &syncBuffer{}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.NoSandbox, // root in CI
		chromedp.DisableGPU,
		// This machine has no outside network: no background fetches.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 960),
		chromedp.CombinedOutput(out),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first action starts the browser and binds it to ctx, which must
	// outlive this call: a timer bounds the start instead of a deadline.
	stuck := time.AfterFunc(2*time.Minute, cancel)
	err := chromedp.Do(ctx)
	if !stuck.Stop() {
		err = fmt.Errorf("no answer within 2 minutes (%v)", err)
	}
	if err != nil {
		t.Fatalf("start chromium (%s): %v\nits output:\n%s", chromiumPath, err, out.String())
	}
	return ctx
}

// browse runs one browser action with a deadline.
func browse[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(actx, a)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// textOf is the text of the first element matching a CSS selector, "" when
// there is none.
func textOf(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return browse(t, ctx, chromedp.Evaluate[string](fmt.Sprintf(
		`(function(){ var e = document.querySelector(%q); return e ? e.textContent.trim() : ""; })()`, sel)))
}

// waitText waits until the element's text is want, or fails after a
// generous deadline.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := textOf(t, ctx, sel)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s shows %q, want %q", sel, got, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(body)
}

// externalRef finds what would make a browser fetch from elsewhere: an
// absolute or protocol-relative URL, a CSS import or url().
var externalRef = regexp.MustCompile(`(?i)https?:|(src|href|action)\s*=\s*["']?//|@import|url\(`)

// The status page, in a real browser: the node's streams and a group's lag
// are in the HTML before any script runs, a publish shows without a
// reload, an alarm shows as text, and nothing is fetched from elsewhere.
func TestStatusPage_InABrowser(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "peat.yaml")
	if err := os.WriteFile(cfg, []byte(`streams:
  - name: telemetry
    filters: ["sensors/#"]
    retention: {max_age: 7d, max_bytes: 1GiB}
  - name: default
    filters: ["#"]
sinks:
  - name: cloud
    streams: [telemetry]
    mqtt: {url: "mqtt://127.0.0.1:1", client_id: site-a}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startPeat(t, filepath.Join(dir, "data"), "--config", cfg)
	base := "http://" + p.httpAddr
	publishN(t, p.mqttAddr, "sensors/a/temp", 120)
	publishN(t, p.mqttAddr, "plant/pump/1", 8)
	mqttPublish(t, p.mqttAddr, "$offsets/billing/telemetry", "90")
	consumer := groupConsumer(t, p.mqttAddr, "dashboard-1", "$group/dashboard/+/sensors/#")
	defer consumer.Disconnect(0)

	// Before any script: the server's HTML and its assets.
	page := httpGet(t, base+"/")
	for _, want := range []string{
		`<tr data-stream="telemetry"><td>telemetry</td><td>sensors/#</td>`,
		`<tr data-stream="default"><td>default</td><td>#</td>`,
		`<tr data-group="billing" data-stream="telemetry">`,
		`data-field="lag_records">30<`,
		`<tr data-sink="cloud"><td>cloud</td><td>mqtt</td><td>mqtt://127.0.0.1:1</td>`, // its upstream is down
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page's HTML lacks %s", want)
		}
	}
	for name, body := range map[string]string{
		"/": page, "/assets/status.css": httpGet(t, base+"/assets/status.css"), "/assets/status.js": httpGet(t, base+"/assets/status.js"),
	} {
		if m := externalRef.FindString(body); m != "" {
			t.Errorf("%s refers outside the node: %q", name, m)
		}
	}

	if os.Getenv(screenshotEnv) != "" {
		for range 3 { // sparklines: a point every 5 s
			publishN(t, p.mqttAddr, "sensors/b/hum", 60)
			time.Sleep(5 * time.Second)
		}
	}

	ctx := startBrowser(t)
	browse(t, ctx, chromedp.Navigate(base+"/"))
	if got := textOf(t, ctx, `#groups tr[data-group="billing"] td[data-field="lag_records"]`); got == "" {
		t.Fatalf("the browser shows no lag for group billing")
	}
	// A marker the page keeps only as long as it is not reloaded.
	browse(t, ctx, chromedp.Evaluate[chromedp.Void](`window.peatTestMarker = 1`))
	next := textOf(t, ctx, `#streams tr[data-stream="default"] td[data-field="next_offset"]`)
	if next != "8" {
		t.Fatalf("stream default shows next offset %q, want 8", next)
	}
	publishN(t, p.mqttAddr, "plant/pump/2", 5)
	waitText(t, ctx, `#streams tr[data-stream="default"] td[data-field="next_offset"]`, "13")
	if marked := browse(t, ctx, chromedp.Evaluate[bool](`window.peatTestMarker === 1`)); !marked {
		t.Errorf("the page reloaded to show the publish; want a live update")
	}
	if got := textOf(t, ctx, `#groups tr[data-group="dashboard"] td:last-child`); got != "dashboard-1" {
		t.Errorf("group dashboard's consumer shows as %q, want dashboard-1", got)
	}

	// Everything the page loaded came from the node.
	urls := browse(t, ctx, chromedp.Evaluate[[]string](
		`[location.href].concat(performance.getEntriesByType("resource").map(function (e) { return e.name; }))`))
	if len(urls) < 4 { // the page, its CSS and script, a refresh
		t.Errorf("the browser loaded only %q", urls)
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, base+"/") {
			t.Errorf("the page loaded %s, outside the node (%s)", u, base)
		}
	}

	shot := browse(t, ctx, chromedp.CaptureScreenshot())
	path := filepath.Join(t.TempDir(), "status-page.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(shot))
	if dst := os.Getenv(screenshotEnv); dst != "" {
		if err := os.WriteFile(dst, shot, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// An alarm shows as text, on a node that refuses publishes.
	alarming := alarmingNode(t)
	browse(t, ctx, chromedp.Navigate("http://"+alarming.httpAddr+"/"))
	alarm := textOf(t, ctx, `#alarms [data-alarm="disk_reserve"]`)
	if !strings.HasPrefix(alarm, "critical refusing publishes:") || !strings.Contains(alarm, "storage.min_free_bytes") {
		t.Errorf("the alarm shows as %q, want the critical disk_reserve text", alarm)
	}
	if vis := browse(t, ctx, chromedp.Evaluate[bool](
		`(function(){ var e = document.querySelector('#alarms [data-alarm="disk_reserve"]'); var r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; })()`)); !vis {
		t.Errorf("the alarm is in the page but not visible")
	}
}

// groupConsumer subscribes client id to a $group filter at QoS 1 and
// stays connected (the group's active consumer).
func groupConsumer(t *testing.T, addr, id, filter string) paho.Client {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	if tok := c.Subscribe(filter, 1, func(paho.Client, paho.Message) {}); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s to %s: %v", id, filter, tok.Error())
	}
	return c
}

// On a site node the page's site section is kept live by the script too:
// it shows the member, the controller and the stream's in-sync replicas,
// and a refresh rebuilds the tables without an error (an error marks the
// page stale).
func TestStatusPage_SiteInABrowser(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "peat.yaml")
	yaml := "cluster:\n  name: test-site\n  node_id: n1\n  listen: 127.0.0.1:0\n  expect: 1\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startPeat(t, filepath.Join(dir, "data"), "--config", cfg)
	ctx := startBrowser(t)
	browse(t, ctx, chromedp.Navigate("http://"+p.httpAddr+"/"))
	waitText(t, ctx, `#replication tr[data-stream="default"] td[data-field="isr"]`, "n1")
	waitText(t, ctx, `#controller`, "n1")
	waitText(t, ctx, `#members tr[data-member="n1"] td[data-field="state"]`, "alive")
	// A mark on the rows that only a rebuild by the script removes.
	browse(t, ctx, chromedp.Evaluate[chromedp.Void](
		`document.querySelectorAll("#members tbody tr, #replication tbody tr").forEach(function (r) { r.dataset.mark = "1"; })`))
	waitText(t, ctx, `#replication tr[data-stream="default"][data-mark]`, "")
	waitText(t, ctx, `#members tr[data-member="n1"][data-mark]`, "")
	waitText(t, ctx, `#replication tr[data-stream="default"] td[data-field="leader"]`, "n1")
	if stale := browse(t, ctx, chromedp.Evaluate[bool](`document.body.classList.contains("stale")`)); stale {
		t.Fatal("the page is marked stale: its refresh failed")
	}
}
