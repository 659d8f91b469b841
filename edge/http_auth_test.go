package edge

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/edge/auth"
)

// newTokenLine makes a token and its tokens-file line.
func newTokenLine(tb testing.TB, name string, role auth.Role) (string, string) {
	tb.Helper()
	tok, line, err := auth.NewToken(name, role)
	if err != nil {
		tb.Fatal(err)
	}
	return tok, line + "\n"
}

// The HTTP API over TLS with bearer tokens: health endpoints public,
// everything else by token, writes by admin tokens only, each refusal
// counted; SIGHUP's reload takes new tokens.
func TestNode_HTTPTokensAndTLS(t *testing.T) {
	p := newTestPKI(t, "unused")
	dir := t.TempDir()
	readTok, readLine := newTokenLine(t, "grafana", auth.RoleRead)
	adminTok, adminLine := newTokenLine(t, "ops", auth.RoleAdmin)
	cfg := testConfig(t)
	cfg.HTTP.TokensFile = writeAuthFile(t, dir, "tokens", "# API\n"+readLine+adminLine)
	cfg.HTTP.TLS = HTTPTLSConfig{CertFile: p.certFile, KeyFile: p.keyFile}
	n := startNode(t, cfg)
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1"}}}
	base := "https://" + n.HTTPAddr().String()
	do := func(method, path, tok string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(body)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _, _ := do("GET", path, ""); code != http.StatusOK {
			t.Errorf("%s without a token: %d, want 200", path, code)
		}
	}
	if code, h, _ := do("GET", "/api/v1/streams", ""); code != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("no token: %d %q, want 401 with WWW-Authenticate: Bearer", code, h.Get("WWW-Authenticate"))
	}
	if code, _, _ := do("GET", "/api/v1/streams", readTok+"x"); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d, want 401", code)
	}
	if code, _, body := do("GET", "/api/v1/streams", readTok); code != http.StatusOK || !strings.Contains(body, `"default"`) {
		t.Errorf("read token: %d %s", code, body)
	}
	if code, _, _ := do("DELETE", "/api/v1/streams/default", readTok); code != http.StatusForbidden {
		t.Errorf("DELETE with a read token: %d, want 403", code)
	}
	if code, _, _ := do("DELETE", "/api/v1/streams/default", adminTok); code == http.StatusForbidden || code == http.StatusUnauthorized {
		t.Errorf("DELETE with an admin token: %d, want it past the token check", code)
	}
	_, _, metrics := do("GET", "/metrics", readTok)
	for _, want := range []string{`peat_http_denied_total{reason="unauthenticated"} 2`, `peat_http_denied_total{reason="forbidden"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	newTok, newLine := newTokenLine(t, "late", auth.RoleRead)
	writeAuthFile(t, dir, "tokens", readLine+adminLine+newLine)
	if code, _, _ := do("GET", "/api/v1/streams", newTok); code != http.StatusUnauthorized {
		t.Fatalf("a token not yet reloaded: %d, want 401", code)
	}
	if err := n.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if code, _, _ := do("GET", "/api/v1/streams", newTok); code != http.StatusOK {
		t.Errorf("after reload: %d, want 200", code)
	}

	// Plain HTTP on the TLS listener gets no API.
	resp, err := http.Get("http://" + n.HTTPAddr().String() + "/api/v1/streams")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), `"default"`) {
			t.Error("plain HTTP served the API")
		}
	}
}
