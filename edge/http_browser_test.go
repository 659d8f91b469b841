package edge

import (
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/edge/auth"
)

// browserRequest is one request as a browser (or curl) would send it.
type browserRequest struct {
	method, path string
	host         string            // Host header; empty: the address dialled
	header       map[string]string // Origin, Content-Type, Sec-Fetch-Site...
}

// send sends r to the HTTP listener at addr and returns the status and body.
func (r browserRequest) send(tb testing.TB, addr string) (int, string) {
	tb.Helper()
	var body io.Reader
	if r.method != http.MethodGet {
		body = strings.NewReader("") // a form with no fields
	}
	req, err := http.NewRequest(r.method, "http://"+addr+r.path, body)
	if err != nil {
		tb.Fatal(err)
	}
	if r.host != "" {
		req.Host = r.host
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// sinkPaused reports whether the node's sink cloud is paused.
func sinkPaused(tb testing.TB, addr string) bool {
	tb.Helper()
	code, body := browserRequest{method: http.MethodGet, path: "/api/v1/sinks/cloud"}.send(tb, addr)
	if code != http.StatusOK {
		tb.Fatalf("GET /api/v1/sinks/cloud: %d %s", code, body)
	}
	return strings.Contains(body, `"paused"`)
}

// On the default loopback HTTP listener, with no tokens: what a page of
// another site can make a browser send changes nothing, and a page
// under a name rebound to 127.0.0.1 reads nothing; the CLI, curl and
// the node's own status page keep working.
func TestNode_HTTPRefusesBrowsersOfOtherSites(t *testing.T) {
	cfg := sinkConfig(t, "127.0.0.1:1") // nothing listens: the sink retries, which is fine
	n := startNode(t, cfg)
	addr := n.HTTPAddr().String()
	_, port, _ := net.SplitHostPort(addr)
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	hostname, _ := os.Hostname()
	const pause = "/api/v1/sinks/cloud/pause"

	refused := []struct {
		name string
		req  browserRequest
		code int
	}{
		{"cross-site form POST", browserRequest{http.MethodPost, pause, "", map[string]string{
			"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}}, http.StatusForbidden},
		{"cross-site text/plain POST without Sec-Fetch-Site", browserRequest{http.MethodPost, pause, "", map[string]string{
			"Content-Type": "text/plain", "Origin": "http://evil.example"}}, http.StatusForbidden},
		{"JSON from another origin", browserRequest{http.MethodPost, pause, "", map[string]string{
			"Content-Type": "application/json", "Origin": "http://evil.example"}}, http.StatusForbidden},
		{"JSON from another scheme of this host", browserRequest{http.MethodPost, pause, "", map[string]string{
			"Content-Type": "application/json", "Origin": "https://" + addr}}, http.StatusForbidden},
		{"JSON marked cross-site", browserRequest{http.MethodPost, pause, "", map[string]string{
			"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}}, http.StatusForbidden},
		{"opaque origin", browserRequest{http.MethodPost, pause, "", map[string]string{
			"Content-Type": "application/json", "Origin": "null"}}, http.StatusForbidden},
		{"form POST without Origin", browserRequest{http.MethodPost, pause, "", form}, http.StatusUnsupportedMediaType},
		{"bodiless POST without a type", browserRequest{http.MethodPost, pause, "", nil}, http.StatusUnsupportedMediaType},
		{"DNS rebinding: a read", browserRequest{http.MethodGet, "/api/v1/status", "evil.example:" + port, nil}, http.StatusForbidden},
		{"DNS rebinding: the status page", browserRequest{http.MethodGet, "/", "evil.example:" + port, nil}, http.StatusForbidden},
		{"DNS rebinding: same-origin JSON", browserRequest{http.MethodPost, pause, "evil.example:" + port, map[string]string{
			"Content-Type": "application/json", "Origin": "http://evil.example:" + port}}, http.StatusForbidden},
		{"a LAN address on a loopback listener", browserRequest{http.MethodGet, "/api/v1/status", "192.168.1.10:" + port, nil}, http.StatusForbidden},
	}
	for _, tc := range refused {
		code, body := tc.req.send(t, addr)
		if code != tc.code || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s, want %d with a JSON error", tc.name, code, body, tc.code)
		}
	}
	if sinkPaused(t, addr) {
		t.Fatal("a refused request paused the sink")
	}

	served := []struct {
		name string
		req  browserRequest
	}{
		{"localhost", browserRequest{http.MethodGet, "/api/v1/status", "localhost:" + port, nil}},
		{"LOCALHOST.", browserRequest{http.MethodGet, "/api/v1/status", "LOCALHOST.:" + port, nil}},
		{"[::1]", browserRequest{http.MethodGet, "/api/v1/status", "[::1]:" + port, nil}},
		{"the host name", browserRequest{http.MethodGet, "/api/v1/status", hostname + ":" + port, nil}},
		{"health under any name", browserRequest{http.MethodGet, "/healthz", "evil.example:" + port, nil}},
		{"the status page's own fetch", browserRequest{http.MethodGet, "/api/v1/status", "", map[string]string{
			"Sec-Fetch-Site": "same-origin", "Referer": "http://" + addr + "/"}}},
		{"curl with JSON", browserRequest{http.MethodPost, "/api/v1/sinks/cloud/resume", "", map[string]string{"Content-Type": "application/json"}}},
		{"curl with X-Peat-Request", browserRequest{http.MethodPost, "/api/v1/sinks/cloud/resume", "", map[string]string{"X-Peat-Request": "1"}}},
		{"a same-origin page", browserRequest{http.MethodPost, "/api/v1/sinks/cloud/resume", "", map[string]string{
			"Content-Type": "application/json; charset=utf-8", "Origin": "http://" + addr, "Sec-Fetch-Site": "same-origin"}}},
	}
	for _, tc := range served {
		if code, body := tc.req.send(t, addr); code != http.StatusOK {
			t.Errorf("%s: %d %s, want 200", tc.name, code, body)
		}
	}
	if code, body := (browserRequest{http.MethodPost, pause, "localhost:" + port, map[string]string{
		"Content-Type": "application/json"}}).send(t, addr); code != http.StatusOK || !sinkPaused(t, addr) {
		t.Fatalf("pause with JSON: %d %s", code, body)
	}
	_, _, metrics := get(t, http.MethodGet, "http://"+addr+"/metrics")
	for _, want := range []string{`peat_http_denied_total{reason="cross_origin"} 6`, `peat_http_denied_total{reason="content_type"} 2`,
		`peat_http_denied_total{reason="host"} 4`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// auth.allow_anonymous opens the API on a network listener for reading:
// without http.tokens_file nothing there changes anything, and the Host
// must be an address of the node, its host name or an allowed name.
// With tokens, the token decides and any name may be used.
func TestNode_HTTPNetworkListenerWithoutTokensIsReadOnly(t *testing.T) {
	cfg := sinkConfig(t, "127.0.0.1:1")
	cfg.HTTP.Listen, cfg.HTTP.AllowPlaintext, cfg.Auth.AllowAnonymous = "0.0.0.0:0", true, true
	cfg.HTTP.AllowedHosts = []string{"peat.site.lan"}
	n := startNode(t, cfg)
	_, port, _ := net.SplitHostPort(n.HTTPAddr().String())
	addr := "127.0.0.1:" + port
	json := map[string]string{"Content-Type": "application/json"}
	for _, method := range []string{http.MethodPost, http.MethodDelete, http.MethodPut} {
		code, body := browserRequest{method, "/api/v1/streams/default", "", json}.send(t, addr)
		if code != http.StatusForbidden || !strings.Contains(body, "http.tokens_file") {
			t.Errorf("%s without tokens on 0.0.0.0: %d %s, want 403 naming http.tokens_file", method, code, body)
		}
	}
	if code, body := (browserRequest{http.MethodPost, "/api/v1/sinks/cloud/pause", "", json}).send(t, addr); code != http.StatusForbidden || sinkPaused(t, addr) {
		t.Errorf("pause without tokens on 0.0.0.0: %d %s, want 403 and the sink running", code, body)
	}
	hostname, _ := os.Hostname()
	for _, host := range []string{"", "peat.site.lan:" + port, "PEAT.SITE.LAN", "10.1.2.3:" + port, "[fe80::1]:" + port, hostname + ":" + port} {
		if code, body := (browserRequest{http.MethodGet, "/api/v1/status", host, nil}).send(t, addr); code != http.StatusOK {
			t.Errorf("GET with Host %q: %d %s, want 200", host, code, body)
		}
	}
	for _, host := range []string{"evil.example:" + port, "0.0.0.0:" + port, "site.lan"} {
		if code, _ := (browserRequest{http.MethodGet, "/api/v1/status", host, nil}).send(t, addr); code != http.StatusForbidden {
			t.Errorf("GET with Host %q: %d, want 403", host, code)
		}
	}

	// With tokens the Host is not checked; the Origin and type still are.
	tok, line := newTokenLine(t, "ops", auth.RoleAdmin)
	cfg = testConfig(t)
	cfg.HTTP.TokensFile = writeAuthFile(t, t.TempDir(), "tokens", line)
	n = startNode(t, cfg)
	addr = n.HTTPAddr().String()
	bearer := map[string]string{"Authorization": "Bearer " + tok}
	if code, body := (browserRequest{http.MethodGet, "/api/v1/status", "any.name", bearer}).send(t, addr); code != http.StatusOK {
		t.Errorf("GET with a token under any name: %d %s", code, body)
	}
	if code, body := (browserRequest{http.MethodPost, "/api/v1/cluster/rebalance", "", bearer}).send(t, addr); code == http.StatusForbidden || code == http.StatusUnsupportedMediaType {
		t.Errorf("POST with a bearer token (no form sends one): %d %s", code, body)
	}
	if code, _ := (browserRequest{http.MethodPost, "/api/v1/cluster/rebalance", "", map[string]string{
		"Authorization": "Bearer " + tok, "Origin": "http://evil.example"}}).send(t, addr); code != http.StatusForbidden {
		t.Errorf("POST with a token from another origin: %d, want 403", code)
	}
}
