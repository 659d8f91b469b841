package mqtt

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the MQTT front-end's Prometheus collectors.
type Metrics struct {
	Connected     prometheus.Gauge       // peat_mqtt_connected_clients
	Received      *prometheus.CounterVec // peat_mqtt_received_messages_total{stream}: publishes taken into a stream
	Refused       *prometheus.CounterVec // peat_mqtt_refused_messages_total{reason}: publishes not stored and not acked
	Delivered     *prometheus.CounterVec // peat_mqtt_delivered_records_total{stream}: records written to subscribers
	Dropped       *prometheus.CounterVec // peat_mqtt_dropped_messages_total{reason}: messages the broker dropped on purpose
	CursorCatchup prometheus.Counter     // peat_mqtt_subscriber_fallbacks_total: subscribers that left the shared reader for their own cursor
	StartAdjusted prometheus.Counter     // peat_mqtt_replay_start_adjusted_total: replays and groups started elsewhere than asked (below the log start)
	Closed        *prometheus.CounterVec // peat_mqtt_closed_connections_total{reason}: connections refused or disconnected on purpose
	Denied        *prometheus.CounterVec // peat_mqtt_denied_total{reason}: what Auth refused (connect, publish, subscribe, revoked, throttled), and filters deeper than max_topic_levels
	// SessionsExpired: durable sessions this broker ended because their
	// expiry ran out; SessionsAdopted: sessions it took over, in a site,
	// from a broker that failed, left or restarted (sessions_orphans.go).
	SessionsExpired prometheus.Counter // peat_mqtt_sessions_expired_total
	SessionsAdopted prometheus.Counter // peat_mqtt_sessions_adopted_total
	// Panics: panics recovered on a goroutine serving one client (panics.go);
	// each closed that client's connection and nothing else.
	Panics prometheus.Counter // peat_mqtt_panics_total
	// LoginBackoff: logins made to wait after failed ones (backoff.go),
	// by the key that made them wait (address or user); LoginBackoffSeconds:
	// how long they waited in all. Logins refused without a check count in
	// Denied{reason="throttled"}.
	LoginBackoff        *prometheus.CounterVec // peat_mqtt_login_backoffs_total{by}
	LoginBackoffSeconds prometheus.Counter     // peat_mqtt_login_backoff_seconds_total
}

// Reasons for Refused and Dropped.
const (
	ReasonTooLarge     = "too_large"      // payload above max_payload
	ReasonStoreFailed  = "store_failed"   // the log refused the append (disk full, closed)
	ReasonSlowQoS0     = "slow_qos0"      // a QoS 0 delivery lagged more than qos0_max_lag records
	ReasonOutOfRetain  = "retention"      // a lagging cursor's position fell below the log start
	ReasonClientClosed = "client_closed"  // the subscriber disconnected before delivery
	ReasonReadOnly     = "reserved_topic" // a publish to a reserved topic
	ReasonBadCommit    = "bad_commit"     // a publish to $offsets/<group>/<stream> that is not a valid commit
	ReasonMirror       = "mirror"         // a publish routed to a mirror stream, which only its source writes (edge/mirror)
	ReasonTopicLevels  = "topic_levels"   // a topic name deeper than max_topic_levels
	ReasonExpired      = "expired"        // a record whose Message Expiry Interval passed before it was sent (expiry.go)
	// ReasonNotAuthorized: a record a subscription matched that the
	// subscriber's ACL does not let it read (a subscription to # beside a
	// denied subtree), left out.
	ReasonNotAuthorized = "not_authorized"
)

// Reasons for Closed: connections the broker refused or ended on purpose.
const (
	ReasonConnectTimeout  = "connect_timeout"   // no complete CONNECT within connect_timeout
	ReasonConnectTooLarge = "connect_too_large" // CONNECT announced above max_connect_bytes
	ReasonTooManyPending  = "too_many_pending"  // max_pending_connections already await their CONNACK
	// ReasonTooManyPendingFromAddress: max_pending_per_address from the
	// connection's source already await their CONNACK (pending.go).
	ReasonTooManyPendingFromAddress = "too_many_pending_from_address"
	ReasonPacketTooLarge            = "packet_too_large" // a packet above the Maximum Packet Size
	ReasonTopicInvalid              = "topic_invalid"    // a PUBLISH topic name with + or #
	ReasonMalformed                 = "malformed"        // a malformed packet or protocol error the guard recognises (packetcheck.go)
	ReasonReceiveMaximum            = "receive_maximum"  // an MQTT 5 client above the Receive Maximum Peat announced
	ReasonTLSHandshake              = "tls_handshake"    // a failed TLS handshake: no TLS, or a client certificate refused
	// ReasonWebSocketOrigin: a WebSocket upgrade from a page of an origin
	// the listener does not allow (answered 403).
	ReasonWebSocketOrigin = "websocket_origin"
	// ReasonWebSocketHandshake: a connection to a WebSocket listener that
	// is no WebSocket upgrade (answered 400).
	ReasonWebSocketHandshake = "websocket_handshake"
	// ReasonBadAuthMethod: an MQTT 5 CONNECT naming an Authentication
	// Method; Peat supports none (CONNACK 0x8C).
	ReasonBadAuthMethod = "bad_auth_method"
)

// closeReasons are the reasons of Closed, shown at 0 from the start.
var closeReasons = []string{ReasonConnectTimeout, ReasonConnectTooLarge, ReasonTooManyPending, ReasonTooManyPendingFromAddress,
	ReasonPacketTooLarge, ReasonTopicInvalid, ReasonMalformed, ReasonReceiveMaximum, ReasonTLSHandshake,
	ReasonWebSocketOrigin, ReasonWebSocketHandshake, ReasonBadAuthMethod}

// NewMetrics creates the collectors and registers them with reg when reg is
// not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "peat_mqtt_connected_clients", Help: "MQTT clients connected now.",
		}),
		Received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_mqtt_received_messages_total", Help: "Publishes taken into a stream's log.",
		}, []string{"stream"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_mqtt_refused_messages_total", Help: "Publishes refused (not stored, not acknowledged), by reason.",
		}, []string{"reason"}),
		Delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_mqtt_delivered_records_total", Help: "Records written to subscribers from the log.",
		}, []string{"stream"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_mqtt_dropped_messages_total", Help: "Messages the broker dropped on purpose, by reason.",
		}, []string{"reason"}),
		CursorCatchup: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "peat_mqtt_subscriber_fallbacks_total", Help: "Times a lagging subscriber left the shared live reader to read the log with its own cursor.",
		}),
		StartAdjusted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "peat_mqtt_replay_start_adjusted_total", Help: "Replay and group subscriptions whose start was moved, e.g. from below the log start to the log start.",
		}),
		Closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_mqtt_closed_connections_total", Help: "Connections the broker refused or disconnected on purpose (before CONNECT, or for a protocol error), by reason.",
		}, []string{"reason"}),
		Denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_mqtt_denied_total", Help: "CONNECTs, publishes and subscriptions refused by authentication, the ACL or max_topic_levels, by reason.",
		}, []string{"reason"}),
		SessionsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "peat_mqtt_sessions_expired_total", Help: "Durable sessions this broker ended because their expiry ran out.",
		}),
		SessionsAdopted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "peat_mqtt_sessions_adopted_total", Help: "Durable sessions this broker took over from a broker of the site that failed, left or restarted, to run their expiry.",
		}),
		Panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "peat_mqtt_panics_total", Help: "Panics recovered on a goroutine serving one client; each closed that client's connection and nothing else. Any is a bug: report it with the logged stack.",
		}),
		LoginBackoff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_mqtt_login_backoffs_total", Help: "Logins made to wait after failed logins from the same address or for the same user, by which.",
		}, []string{"by"}),
		LoginBackoffSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "peat_mqtt_login_backoff_seconds_total", Help: "Seconds logins waited after failed logins from the same address or for the same user.",
		}),
	}
	for _, by := range []string{backoffBySource, backoffByUser} {
		m.LoginBackoff.WithLabelValues(by)
	}
	// Known reasons show at 0 from the start, so a dashboard or alert sees
	// the series before the first refusal.
	for _, r := range []string{ReasonTooLarge, ReasonStoreFailed, ReasonReadOnly, ReasonBadCommit, ReasonTopicLevels} {
		m.Refused.WithLabelValues(r)
	}
	for _, r := range closeReasons {
		m.Closed.WithLabelValues(r)
	}
	for _, r := range []string{DeniedConnect, DeniedPublish, DeniedSubscribe, DeniedTopicLevels, DeniedRevoked, DeniedThrottled} {
		m.Denied.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Connected, m.Received, m.Refused, m.Delivered, m.Dropped, m.CursorCatchup, m.StartAdjusted, m.Closed, m.Denied,
			m.SessionsExpired, m.SessionsAdopted, m.Panics, m.LoginBackoff, m.LoginBackoffSeconds)
	}
	return m
}
