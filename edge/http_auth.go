package edge

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/peatmq/peat/edge/auth"
)

// HTTPTLSConfig is the HTTP listener's TLS.
type HTTPTLSConfig struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Reasons of peat_http_denied_total.
const (
	httpUnauthenticated = "unauthenticated" // no token, or one not in the tokens file
	httpForbidden       = "forbidden"       // a read token on a method that changes things
)

// Attribute keys of the HTTP refusal lines.
const (
	attrRemote = "remote"
	attrPath   = "path"
	attrToken  = "token"
	attrReason = "reason"
)

func newHTTPDenied(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "peat_http_denied_total", Help: "HTTP API requests refused, by reason: a missing, unknown or too weak bearer token, or what a browser could be made to send.",
	}, []string{"reason"})
	for _, r := range []string{httpUnauthenticated, httpForbidden, httpCrossOrigin, httpContentType, httpHost, httpNoTokens} {
		c.WithLabelValues(r)
	}
	reg.MustRegister(c)
	return c
}

// validateHTTPSecurity is validateSecurity for the HTTP listener.
func (c Config) validateHTTPSecurity(add func(path, format string, args ...any)) {
	t := c.HTTP.TLS
	if (t.CertFile == "") != (t.KeyFile == "") {
		add("http.tls", "cert_file and key_file go together")
	}
	for i, h := range c.HTTP.AllowedHosts {
		if h == "" || strings.ContainsAny(h, ":/ *") {
			add(fmt.Sprintf("http.allowed_hosts[%d]", i), "%q: want a host name, without scheme, port or wildcard", h)
		}
	}
	if c.HTTP.Listen == "" || checkHostPort(c.HTTP.Listen) != "" || loopback(c.HTTP.Listen) {
		return
	}
	if c.HTTP.TokensFile == "" && !c.Auth.AllowAnonymous {
		add("http.listen", "%q is reachable from the network and the API asks no token: set http.tokens_file "+
			"(write it with `peat token`), or auth.allow_anonymous: true to let anyone read the API", c.HTTP.Listen)
	}
	if t.CertFile == "" && !c.HTTP.AllowPlaintext {
		add("http.listen", "%q is reachable from the network without TLS: set http.tls.cert_file and "+
			"http.tls.key_file, or http.allow_plaintext: true to send tokens in the clear", c.HTTP.Listen)
	}
}

// httpListen binds the HTTP listener, with TLS when configured, and
// loads the tokens file. A tokens file that cannot be read or is invalid
// fails the start.
func (n *Node) httpListen() (net.Listener, error) {
	if f := n.cfg.HTTP.TokensFile; f != "" {
		toks, err := auth.LoadTokens(f)
		if err != nil {
			return nil, fmt.Errorf("http.tokens_file: %w", err)
		}
		n.tokens.Store(toks)
	}
	var tcfg *tls.Config
	if t := n.cfg.HTTP.TLS; t.CertFile != "" {
		var err error
		var kp *keyPair
		if tcfg, kp, err = serverTLS(t.CertFile, t.KeyFile); err != nil {
			return nil, fmt.Errorf("http.tls: %w", err)
		}
		n.keyPairs.add(kp)
	}
	ln, err := net.Listen("tcp", n.cfg.HTTP.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen for HTTP on %s: %w", n.cfg.HTTP.Listen, err)
	}
	if tcfg != nil {
		ln = tls.NewListener(ln, tcfg)
	}
	return ln, nil
}

// protect refuses what a browser could be made to send (browserGuard,
// http_browser.go), then asks every request but /healthz and /readyz for
// a bearer token from the tokens file, when there is one: GET and HEAD
// need a read or admin token, other methods admin. Refusals are counted
// and logged, rate-limited.
func (n *Node) protect(next http.Handler) http.Handler {
	limit := newLogLimit(5, 10*time.Second)
	deny := func(w http.ResponseWriter, r *http.Request, status int, reason, name, msg string) {
		n.httpDenied.WithLabelValues(reason).Inc()
		if limit.allow(reason) {
			n.log.Warn("HTTP API: request refused", attrReason, reason, attrRemote, r.RemoteAddr,
				attrPath, r.URL.Path, attrToken, name)
		}
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="peat"`)
		}
		writeError(w, status, msg)
	}
	guard := newBrowserGuard(n.cfg.HTTP)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status, reason, msg := guard.check(r); status != 0 {
			deny(w, r, status, reason, "", msg)
			return
		}
		if n.cfg.HTTP.TokensFile == "" || publicPath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		presented, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		toks := n.tokens.Load()
		if !ok || toks == nil {
			deny(w, r, http.StatusUnauthorized, httpUnauthenticated, "", "a bearer token is required (Authorization: Bearer <token>)")
			return
		}
		name, role, ok := toks.Check(strings.TrimSpace(presented))
		if !ok {
			deny(w, r, http.StatusUnauthorized, httpUnauthenticated, "", "unknown token")
			return
		}
		if role != auth.RoleAdmin && r.Method != http.MethodGet && r.Method != http.MethodHead {
			deny(w, r, http.StatusForbidden, httpForbidden, name, fmt.Sprintf("token %q has role %s; %s needs admin", name, role, r.Method))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// logLimit lets at most burst log lines per key through per interval.
type logLimit struct {
	burst    int
	interval time.Duration
	mu       sync.Mutex
	windows  map[string]*logWindow
}

type logWindow struct {
	start time.Time
	n     int
}

func newLogLimit(burst int, interval time.Duration) *logLimit {
	return &logLimit{burst: burst, interval: interval, windows: map[string]*logWindow{}}
}

func (l *logLimit) allow(key string) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.windows[key]
	if w == nil || now.Sub(w.start) >= l.interval {
		w = &logWindow{start: now}
		l.windows[key] = w
	}
	w.n++
	return w.n <= l.burst
}

// reloadTokens is Reload's part for the tokens file.
func (n *Node) reloadTokens() error {
	toks := n.tokens.Load()
	if toks == nil {
		return nil
	}
	if err := toks.Reload(); err != nil {
		return err
	}
	n.log.Info("HTTP tokens reloaded", slog.Int("tokens", toks.Len()))
	return nil
}
