package edge

import (
	"fmt"

	"github.com/peatmq/peat/mqtt"
)

// ListenerConfig is one entry of mqtt.listeners: an address with its own
// protocol and TLS. mqtt.listen (with mqtt.tls and mqtt.allow_plaintext)
// is the short form of a list of one MQTT listener; a config uses one
// form or the other.
type ListenerConfig struct {
	// Name names the listener in logs; default "<protocol>-<index>".
	Name   string `yaml:"name"`
	Listen string `yaml:"listen"` // host:port
	// Protocol is mqtt (the default) or websocket.
	Protocol string    `yaml:"protocol"`
	TLS      TLSConfig `yaml:"tls"`
	// AllowPlaintext lets this listener serve the network without TLS.
	AllowPlaintext bool `yaml:"allow_plaintext"`
	// AllowedOrigins are the browser origins a websocket listener
	// accepts ("https://hmi.site:8443", or "*"); empty: the page's
	// origin must be the listener's own (scheme and host:port).
	AllowedOrigins []string `yaml:"allowed_origins"`
}

// mqttListener is one MQTT listener of either form, with the YAML path
// of its fields, so that both forms are validated and built alike.
type mqttListener struct {
	path           string // "mqtt" or "mqtt.listeners[i]"
	name           string
	listen         string
	protocol       string
	tls            TLSConfig
	allowPlaintext bool
	origins        []string
}

// field is the YAML path of the listener's field f ("listen", "tls").
func (l mqttListener) field(f string) string { return l.path + "." + f }

// mqttListeners are the configured listeners: mqtt.listen's, or those of
// mqtt.listeners.
func (c Config) mqttListeners() []mqttListener {
	if len(c.MQTT.Listeners) == 0 {
		if c.MQTT.Listen == "" {
			return nil
		}
		return []mqttListener{{path: "mqtt", name: mqtt.DefaultListenerName, listen: c.MQTT.Listen,
			protocol: mqtt.ProtocolMQTT, tls: c.MQTT.TLS, allowPlaintext: c.MQTT.AllowPlaintext}}
	}
	out := make([]mqttListener, len(c.MQTT.Listeners))
	for i, l := range c.MQTT.Listeners {
		proto := l.Protocol
		if proto == "" {
			proto = mqtt.ProtocolMQTT
		}
		name := l.Name
		if name == "" {
			name = fmt.Sprintf("%s-%d", proto, i)
		}
		out[i] = mqttListener{path: fmt.Sprintf("mqtt.listeners[%d]", i), name: name, listen: l.Listen,
			protocol: proto, tls: l.TLS, allowPlaintext: l.AllowPlaintext, origins: l.AllowedOrigins}
	}
	return out
}

// listenPath is where --mqtt and PEAT_MQTT_LISTEN put the address: the
// first listener's.
func (c Config) listenPath() string {
	if len(c.MQTT.Listeners) > 0 {
		return "mqtt.listeners[0].listen"
	}
	return "mqtt.listen"
}

// setListen sets the first listener's address.
func (c *Config) setListen(addr string) {
	if len(c.MQTT.Listeners) > 0 {
		ls := append([]ListenerConfig(nil), c.MQTT.Listeners...) // copies of a Config must not share it
		ls[0].Listen = addr
		c.MQTT.Listeners = ls
		return
	}
	c.MQTT.Listen = addr
}

// validateListeners reports a config that mixes the two forms, and a
// list or an address that is missing.
func (c Config) validateListeners(add func(path, format string, args ...any)) {
	if len(c.MQTT.Listeners) == 0 {
		if c.MQTT.Listen == "" {
			add("mqtt.listen", "must not be empty (or list mqtt.listeners)")
		}
		return
	}
	const both = "set either mqtt.listen (with mqtt.tls and mqtt.allow_plaintext) or mqtt.listeners, not both: "
	if c.MQTT.Listen != "" {
		add("mqtt.listen", both+"with mqtt.listeners, put %q in the list", c.MQTT.Listen)
	}
	if t := c.MQTT.TLS; t != (TLSConfig{}) && t != (TLSConfig{ClientAuth: "none"}) {
		add("mqtt.tls", both+"with mqtt.listeners, give each listener its tls")
	}
	if c.MQTT.AllowPlaintext {
		add("mqtt.allow_plaintext", both+"with mqtt.listeners, give each listener its allow_plaintext")
	}
	for _, l := range c.mqttListeners() {
		if l.listen == "" {
			add(l.field("listen"), "must not be empty")
		} else if msg := checkHostPort(l.listen); msg != "" {
			add(l.field("listen"), "%s", msg)
		}
	}
}

// brokerListeners are mqtt.listeners for the broker, without their TLS
// (node_auth.go reads it).
func (c Config) brokerListeners() []mqtt.Listener {
	if len(c.MQTT.Listeners) == 0 {
		return nil
	}
	out := make([]mqtt.Listener, 0, len(c.MQTT.Listeners))
	for _, l := range c.mqttListeners() {
		out = append(out, mqtt.Listener{Name: l.name, Listen: l.listen, Protocol: l.protocol,
			AllowedOrigins: append([]string(nil), l.origins...)})
	}
	return out
}
