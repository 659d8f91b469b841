package mqtt

import "errors"

// Sentinel errors. Errors returned by this package wrap them; test with
// errors.Is.
var (
	// ErrClosed is returned by Start on a closed Broker.
	ErrClosed = errors.New("mqtt: broker closed")
	// ErrStarted is returned by a second Start.
	ErrStarted = errors.New("mqtt: broker already started")
	// ErrInvalidConfig is wrapped by New's error for a Config that does not
	// validate.
	ErrInvalidConfig = errors.New("mqtt: invalid config")
)

// Errors a Log returns from an append for refusals that mqtt tells an MQTT
// 5 publisher apart (refusal.go); a Log wraps them. A full disk is
// logstore.ErrNoSpace, the log's own.
var (
	// ErrNotEnoughReplicas: fewer in-sync replicas than the stream's
	// min_insync_replicas; nothing was stored.
	ErrNotEnoughReplicas = errors.New("mqtt: not enough in-sync replicas")
	// ErrLeaderUnavailable: the stream has no leader this node can reach
	// (an election is under way, or the leader is partitioned off).
	ErrLeaderUnavailable = errors.New("mqtt: stream leader unavailable")
)

// Refusal is an append error that says why in its own words: an MQTT 5
// publisher gets the reason code of the sentinel Err wraps (refusal.go)
// with "not stored: " and Reason as the reason string, so that a client
// (or the person reading its log) can tell "the leader did not answer in
// time, publish again" from "this node is cut off from the site, try
// another".
type Refusal struct {
	Reason string
	Err    error // wraps ErrLeaderUnavailable, ErrNotEnoughReplicas, ...
}

func (e *Refusal) Error() string { return e.Err.Error() + ": " + e.Reason }
func (e *Refusal) Unwrap() error { return e.Err }

// Refuse is a *Refusal of err with reason.
func Refuse(reason string, err error) error { return &Refusal{Reason: reason, Err: err} }

// Why the connection guard (connguard.go) or ingest ended a connection. They
// are what mochi's read loop returns for it, and what the connection's last
// log line says.
var (
	// ErrTLSHandshake: the TLS handshake failed (Config.TLS).
	ErrTLSHandshake = errors.New("mqtt: TLS handshake failed")
	// ErrConnectTimeout: no complete CONNECT within Config.ConnectTimeout.
	ErrConnectTimeout = errors.New("mqtt: no CONNECT within connect_timeout")
	// ErrConnectTooLarge: a CONNECT announced above Config.MaxConnectSize.
	ErrConnectTooLarge = errors.New("mqtt: CONNECT above max_connect_bytes")
	// ErrPacketTooLarge: a packet announced above the Maximum Packet Size.
	ErrPacketTooLarge = errors.New("mqtt: packet above the maximum packet size")
	// ErrTopicInvalid: a PUBLISH topic name with a wildcard (+ or #).
	ErrTopicInvalid = errors.New("mqtt: PUBLISH topic name with a wildcard")
	// ErrMalformed: a packet MQTT calls malformed (ill-formed UTF-8 or
	// U+0000 in a string, a field running past its packet, reserved bits
	// set, QoS 3).
	ErrMalformed = errors.New("mqtt: malformed packet")
	// ErrProtocolError: a well-framed packet that breaks a rule of the
	// protocol (an empty topic filter, a topic alias never set, Retain
	// Handling 3, a property given twice).
	ErrProtocolError = errors.New("mqtt: protocol error")
	// ErrPanic: a goroutine serving the client panicked; the panic was
	// recovered and only this connection closed (panics.go).
	ErrPanic = errors.New("mqtt: recovered panic")
	// ErrWebSocketOrigin: a WebSocket upgrade from a browser page whose
	// origin the listener does not allow (HTTP 403).
	ErrWebSocketOrigin = errors.New("mqtt: WebSocket origin not allowed")
	// ErrWebSocketHandshake: a connection to a WebSocket listener that is
	// no WebSocket upgrade (HTTP 400).
	ErrWebSocketHandshake = errors.New("mqtt: WebSocket handshake failed")
	// ErrTooManyPending: more connections awaiting their CONNACK than
	// Config.MaxPendingConnections.
	ErrTooManyPending = errors.New("mqtt: too many connections awaiting CONNACK")
	// ErrTooManyPendingFromAddress: more connections from one source
	// awaiting their CONNACK than Config.MaxPendingPerAddress.
	ErrTooManyPendingFromAddress = errors.New("mqtt: too many connections from one address awaiting CONNACK")
	// ErrBadAuthMethod: an MQTT 5 CONNECT asking for enhanced
	// authentication (an Authentication Method), which Peat does not do.
	ErrBadAuthMethod = errors.New("mqtt: authentication method not supported")
)
