package sink

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the sinks' Prometheus metrics, labelled sink and stream.
// A nil *Metrics counts into unregistered collectors.
type Metrics struct {
	Lag         *prometheus.GaugeVec
	LagSeconds  *prometheus.GaugeVec
	Committed   *prometheus.GaugeVec
	LastSuccess *prometheus.GaugeVec
	State       *prometheus.GaugeVec
	Sent        *prometheus.CounterVec
	Acked       *prometheus.CounterVec
	Retried     *prometheus.CounterVec
	Lost        *prometheus.CounterVec
	Echoes      *prometheus.CounterVec
	Errors      *prometheus.CounterVec
	Reconnects  *prometheus.CounterVec
	AckLatency  *prometheus.HistogramVec
}

// NewMetrics creates the metrics and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	ss := []string{"sink", "stream"}
	m := &Metrics{
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "peat_sink_lag_records",
			Help: "Records of the stream the sink has not had acknowledged upstream."}, ss),
		LagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "peat_sink_lag_seconds",
			Help: "Age of the oldest record the sink has not had acknowledged upstream."}, ss),
		Committed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "peat_sink_committed_offset",
			Help: "The sink's durable position: every record below it was acknowledged upstream."}, ss),
		LastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "peat_sink_last_success_timestamp_seconds",
			Help: "When the upstream last acknowledged a record of the stream (unix seconds)."}, ss),
		State: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "peat_sink_state",
			Help: "1 for the sink's current state in the stream (connecting, connected, stalled, paused, standby: another node of the site leads it), 0 for the others."},
			[]string{"sink", "stream", "state"}),
		Sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_sink_sent_records_total",
			Help: "Records sent upstream, resends included."}, ss),
		Acked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_sink_acked_records_total",
			Help: "Records the upstream acknowledged."}, ss),
		Retried: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_sink_retried_records_total",
			Help: "Records sent again after a connection failed before their acknowledgement."}, ss),
		Lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_sink_lost_records_total",
			Help: "Records retention dropped before the sink sent them (each range is logged)."}, ss),
		Echoes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_sink_echo_skipped_records_total",
			Help: "Records not sent because a source brought them down from this sink's upstream (no echo)."}, ss),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_sink_errors_total",
			Help: "Upstream failures by reason (network, timeout, refused, protocol, tls, auth, config, commit, read, resume)."},
			[]string{"sink", "reason"}),
		Reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_sink_reconnects_total",
			Help: "Connections to the upstream after the first."}, []string{"sink"}),
		AckLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "peat_sink_ack_latency_seconds",
			Help:    "Time from sending a record to its acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"sink"}),
	}
	if reg != nil {
		reg.MustRegister(m.Lag, m.LagSeconds, m.Committed, m.LastSuccess, m.State, m.Sent, m.Acked,
			m.Retried, m.Lost, m.Echoes, m.Errors, m.Reconnects, m.AckLatency)
	}
	return m
}

// sinkMetrics are one sink's children.
type sinkMetrics struct {
	m          *Metrics
	sink       string
	reconnects prometheus.Counter
	ackLatency prometheus.Observer
}

func (m *Metrics) forSink(name string) sinkMetrics {
	if m == nil {
		m = NewMetrics(nil)
	}
	return sinkMetrics{
		m: m, sink: name,
		reconnects: m.Reconnects.WithLabelValues(name),
		ackLatency: m.AckLatency.WithLabelValues(name),
	}
}

func (sm sinkMetrics) errors(reason string) prometheus.Counter {
	return sm.m.Errors.WithLabelValues(sm.sink, reason)
}

// forget removes every series of the sink: a sink that no longer runs
// shows nothing rather than its last values.
func (sm sinkMetrics) forget() {
	l := prometheus.Labels{"sink": sm.sink}
	for _, v := range sm.m.vecs() {
		v.DeletePartialMatch(l)
	}
}

// vecs are the metrics as one list, for deleting a sink's or a stream's
// series.
func (m *Metrics) vecs() []interface {
	DeletePartialMatch(prometheus.Labels) int
} {
	return []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{
		m.Lag, m.LagSeconds, m.Committed, m.LastSuccess, m.State, m.Sent, m.Acked,
		m.Retried, m.Lost, m.Echoes, m.Errors, m.Reconnects, m.AckLatency,
	}
}

// streamMetrics are one sink's children in one stream.
type streamMetrics struct {
	m            *Metrics
	sink, stream string

	lag, lagSeconds, committed prometheus.Gauge
	state                      map[State]prometheus.Gauge
	sent, acked, retried, lost prometheus.Counter
	echoes                     prometheus.Counter
}

func (sm sinkMetrics) forStream(stream string) streamMetrics {
	m, l := sm.m, []string{sm.sink, stream}
	st := make(map[State]prometheus.Gauge, len(States))
	for _, s := range States {
		st[s] = m.State.WithLabelValues(sm.sink, stream, string(s))
	}
	return streamMetrics{
		m: m, sink: sm.sink, stream: stream,
		lag: m.Lag.WithLabelValues(l...), lagSeconds: m.LagSeconds.WithLabelValues(l...),
		committed: m.Committed.WithLabelValues(l...),
		state:     st,
		sent:      m.Sent.WithLabelValues(l...), acked: m.Acked.WithLabelValues(l...),
		retried: m.Retried.WithLabelValues(l...), lost: m.Lost.WithLabelValues(l...),
		echoes: m.Echoes.WithLabelValues(l...),
	}
}

// set updates the gauges from a status; only the monitor calls it. A
// stream with no acknowledgement to show (none yet, or on standby: the
// leader's are newer) has no last-success series, rather than an old one.
func (m streamMetrics) set(ss StreamStatus) {
	m.lag.Set(float64(ss.LagRecords))
	m.lagSeconds.Set(ss.LagSeconds)
	m.committed.Set(float64(ss.CommittedOffset))
	if ss.LastSuccess != nil {
		m.m.LastSuccess.WithLabelValues(m.sink, m.stream).Set(float64(ss.LastSuccess.UnixNano()) / 1e9)
	} else {
		m.m.LastSuccess.DeleteLabelValues(m.sink, m.stream)
	}
	for s, g := range m.state {
		if s == ss.State {
			g.Set(1)
		} else {
			g.Set(0)
		}
	}
}

// forget removes every series of the sink in the stream (the sink no
// longer sends it); only the monitor calls it. Children taken before stay
// usable but are no longer exported.
func (m streamMetrics) forget() {
	l := prometheus.Labels{"sink": m.sink, "stream": m.stream}
	for _, v := range m.m.vecs() {
		v.DeletePartialMatch(l)
	}
}
