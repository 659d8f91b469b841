package mqtt

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Protocols of a Listener.
const (
	ProtocolMQTT      = "mqtt"      // MQTT over TCP, or over TLS
	ProtocolWebSocket = "websocket" // MQTT over WebSocket (ws), or over TLS (wss)
)

// DefaultListenerName names the listener of Config.Listen.
const DefaultListenerName = "mqtt"

// Listener is one address the broker serves, with its own protocol and
// TLS. Every listener runs the connection guard (Config.ConnectTimeout,
// MaxConnectSize, MaxPendingConnections, each bound per listener).
type Listener struct {
	// Name names the listener in log lines and in Login.Listener; unique
	// among the broker's listeners.
	Name string
	// Listen is the TCP address to bind, host:port.
	Listen string
	// Protocol is ProtocolMQTT ("" too) or ProtocolWebSocket.
	Protocol string
	// TLS, when set, is served on every connection under the guard, so
	// the handshake counts against ConnectTimeout and
	// MaxPendingConnections; for a WebSocket listener that is wss.
	TLS *tls.Config
	// AllowedOrigins are the browser origins ("https://hmi.site:8443") a
	// WebSocket listener accepts; "*" accepts any. A request without an
	// Origin header (not a browser) is accepted; with an empty list only
	// a page of the listener's own origin is (https for wss, http for
	// ws, and the Host header's host:port).
	AllowedOrigins []string
}

// websocket reports whether l serves MQTT over WebSocket.
func (l Listener) websocket() bool { return l.Protocol == ProtocolWebSocket }

// listeners is every listener the broker binds: Config.Listen's first,
// then Config.Listeners.
func (c Config) listeners() []Listener {
	out := make([]Listener, 0, 1+len(c.Listeners))
	if c.Listen != "" {
		out = append(out, Listener{Name: DefaultListenerName, Listen: c.Listen, Protocol: ProtocolMQTT, TLS: c.TLS})
	}
	return append(out, c.Listeners...)
}

// validateListeners reports the problems of Config.Listeners, each named
// "listeners[i].field".
func (c Config) validateListeners() []error {
	var errs []error
	names := map[string]bool{}
	if c.Listen != "" {
		names[DefaultListenerName] = true
	}
	for i, l := range c.Listeners {
		p := fmt.Sprintf("listeners[%d]", i)
		switch {
		case l.Name == "":
			errs = append(errs, fmt.Errorf("%s.name: must not be empty", p))
		case names[l.Name]:
			errs = append(errs, fmt.Errorf("%s.name: %q names another listener too", p, l.Name))
		}
		names[l.Name] = true
		if _, _, err := net.SplitHostPort(l.Listen); err != nil {
			errs = append(errs, fmt.Errorf("%s.listen: %q is not host:port: %w", p, l.Listen, err))
		}
		switch l.Protocol {
		case "", ProtocolMQTT:
			if len(l.AllowedOrigins) > 0 {
				errs = append(errs, fmt.Errorf("%s.allowed_origins: only for protocol %s", p, ProtocolWebSocket))
			}
		case ProtocolWebSocket:
			for _, o := range l.AllowedOrigins {
				if _, err := normalizeOrigin(o); err != nil {
					errs = append(errs, fmt.Errorf("%s.allowed_origins: %w", p, err))
				}
			}
		default:
			errs = append(errs, fmt.Errorf("%s.protocol: must be %s or %s, got %q", p, ProtocolMQTT, ProtocolWebSocket, l.Protocol))
		}
	}
	return errs
}

var errOrigin = errors.New("not an origin")

// normalizeOrigin returns o as a browser sends it in the Origin header
// (scheme://host[:port], lower case), or "*".
func normalizeOrigin(o string) (string, error) {
	if o == "*" {
		return o, nil
	}
	u, err := url.Parse(strings.TrimSuffix(o, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("%w: %q (want scheme://host[:port], like https://hmi.example:8443, or *)", errOrigin, o)
	}
	return strings.ToLower(u.Scheme + "://" + u.Host), nil
}
