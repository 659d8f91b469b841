package edge

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// What the HTTP API accepts from a browser. A token is the API's
// authentication, but a browser sends no bearer token on its own, so a
// node without tokens (the default, on loopback) trusts whoever reaches
// it; these checks keep that from including a page of another site
// open in a browser on the same machine or LAN:
//
//   - A request that changes something (any method but GET, HEAD and
//     OPTIONS) must carry what no HTML form can send without the
//     browser asking first (a CORS preflight, which the API never
//     grants): Content-Type application/json, an Authorization header,
//     or an X-Peat-Request header. A form or a "simple" fetch gets 415.
//   - If it comes from a browser page (Origin, Sec-Fetch-Site), that page
//     must be the API's own origin, scheme included: 403.
//   - Without http.tokens_file, the Host must name the node: an IP
//     address (a loopback one on a loopback listener), localhost, the
//     listen host, the machine's host name, or one of
//     http.allowed_hosts. Otherwise a page whose name is rebound to
//     the node's address (DNS rebinding) would be same-origin with it
//     and could read and change everything: 403. /healthz and /readyz
//     answer under any name, for probes.
//   - Without http.tokens_file, a listener reachable from the network
//     changes nothing (auth.allow_anonymous lets anyone read, never
//     write): 403.

// Reasons of peat_http_denied_total for what a browser could be made to send.
const (
	httpCrossOrigin = "cross_origin" // a change asked by a page of another origin
	httpContentType = "content_type" // a change an HTML form could ask for
	httpHost        = "host"         // a Host that names something else, without tokens
	httpNoTokens    = "no_tokens"    // a change on a network listener without tokens_file
)

// peatRequestHeader marks a request as a program's, not a form's.
const peatRequestHeader = "X-Peat-Request"

// browserGuard holds what the checks need of the HTTP configuration.
type browserGuard struct {
	loopback bool            // the listener binds loopback only
	tokens   bool            // http.tokens_file is set
	names    map[string]bool // lower-case host names the API answers to without tokens
}

func newBrowserGuard(c HTTPConfig) *browserGuard {
	g := &browserGuard{loopback: loopback(c.Listen), tokens: c.TokensFile != "",
		names: map[string]bool{"localhost": true}}
	if host, _, err := net.SplitHostPort(c.Listen); err == nil && host != "" && net.ParseIP(host) == nil {
		g.names[normalHost(host)] = true
	}
	if h, err := os.Hostname(); err == nil && h != "" { // Debian maps it to 127.0.1.1
		g.names[normalHost(h)] = true
	}
	for _, h := range c.AllowedHosts {
		g.names[normalHost(h)] = true
	}
	return g
}

// check returns the status, reason and message of a refusal, or 0.
func (g *browserGuard) check(r *http.Request) (int, string, string) {
	if !g.tokens && !publicPath(r.URL.Path) && !g.hostAllowed(r.Host) {
		return http.StatusForbidden, httpHost, fmt.Sprintf("Host %q does not name this node: without http.tokens_file the API "+
			"answers only to its IP addresses, localhost and http.allowed_hosts (a page of another site may have "+
			"rebound its name to this address)", r.Host)
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return 0, "", ""
	}
	if !g.loopback && !g.tokens {
		return http.StatusForbidden, httpNoTokens, fmt.Sprintf("%s needs an admin token, and this listener, reachable from the "+
			"network, has no http.tokens_file (auth.allow_anonymous lets anyone read the API, never change anything)", r.Method)
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return http.StatusForbidden, httpCrossOrigin, fmt.Sprintf("a %s request from a %s page is refused", r.Method, site)
	}
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r) {
		return http.StatusForbidden, httpCrossOrigin, fmt.Sprintf("a %s request from a page of %q is refused: "+
			"only the API's own origin may change anything", r.Method, o)
	}
	if !programRequest(r) {
		return http.StatusUnsupportedMediaType, httpContentType, fmt.Sprintf("a %s request needs Content-Type: application/json "+
			"or an %s header (what an HTML form sends is refused)", r.Method, peatRequestHeader)
	}
	return 0, "", ""
}

// publicPath: the paths probes ask for, which tell nothing and change nothing.
func publicPath(p string) bool { return p == "/healthz" || p == "/readyz" }

// hostAllowed reports whether hostport, a Host header, names this node.
func (g *browserGuard) hostAllowed(hostport string) bool {
	if hostport == "" {
		return true // HTTP/1.0 without Host: no browser
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = normalHost(host)
	if ip := net.ParseIP(host); ip != nil {
		// A name can be rebound, an address cannot: a page at an address
		// is that address's. 0.0.0.0 reaches localhost in some browsers.
		return !ip.IsUnspecified() && (!g.loopback || ip.IsLoopback())
	}
	return g.names[host]
}

// normalHost is a host name as compared: lower case, without brackets or
// the trailing dot of a fully qualified name.
func normalHost(h string) string {
	return strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
}

// sameOrigin reports whether origin is the API's own: the same scheme and
// host:port the request was sent to.
func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false // "null": a sandboxed page, a file, a redirect
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return strings.EqualFold(u.Scheme, scheme) && strings.EqualFold(u.Host, r.Host)
}

// programRequest reports whether r carries what only a script allowed by
// CORS, or a program, can send.
func programRequest(r *http.Request) bool {
	if r.Header.Get(peatRequestHeader) != "" || r.Header.Get("Authorization") != "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "application/json"
}
