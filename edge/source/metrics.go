package source

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the sources' Prometheus metrics, labelled source. A nil
// *Metrics counts into unregistered collectors.
type Metrics struct {
	State         *prometheus.GaugeVec
	Received      *prometheus.CounterVec
	Appended      *prometheus.CounterVec
	Bytes         *prometheus.CounterVec
	Duplicates    *prometheus.CounterVec
	Dropped       *prometheus.CounterVec
	Errors        *prometheus.CounterVec
	Reconnects    *prometheus.CounterVec
	Pending       *prometheus.GaugeVec
	Lag           *prometheus.GaugeVec
	LastReceived  *prometheus.GaugeVec
	AppendLatency *prometheus.HistogramVec
}

// NewMetrics creates the metrics and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	l := []string{"source"}
	m := &Metrics{
		State: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "peat_source_state",
			Help: "1 for the source's current state (connecting, connected, stalled, paused, standby: another node of the site leads its stream), 0 for the others."},
			[]string{"source", "state"}),
		Received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_source_received_messages_total",
			Help: "Messages received from the upstream, redeliveries included."}, l),
		Appended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_source_appended_records_total",
			Help: "Records the source appended to its stream (committed)."}, l),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_source_appended_bytes_total",
			Help: "Payload bytes of the records the source appended."}, l),
		Duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_source_duplicates_total",
			Help: "Redeliveries the log already held (MQTT QoS 2), acknowledged and not stored again."}, l),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_source_dropped_messages_total",
			Help: "Messages acknowledged and not stored, by reason (uncaptured: another stream captures the mapped topic; invalid: no valid local topic; echo: this node's own sink sent it up)."},
			[]string{"source", "reason"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_source_errors_total",
			Help: "Upstream failures by reason (network, timeout, refused, protocol, tls, auth, append)."},
			[]string{"source", "reason"}),
		Reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "peat_source_reconnects_total",
			Help: "Connections to the upstream after the first."}, l),
		Pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "peat_source_pending_messages",
			Help: "Messages received and not yet durable here (so not yet acknowledged upstream)."}, l),
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "peat_source_lag_records",
			Help: "Records the upstream holds beyond what the source fetched, where the upstream reports it (Kafka)."}, l),
		LastReceived: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "peat_source_last_received_timestamp_seconds",
			Help: "When the source last received a message (unix seconds)."}, l),
		AppendLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "peat_source_append_latency_seconds",
			Help:    "Time from receiving a batch to its records being durable (and the batch acknowledged upstream).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, l),
	}
	if reg != nil {
		reg.MustRegister(m.vecs()...)
	}
	return m
}

func (m *Metrics) vecs() []prometheus.Collector {
	return []prometheus.Collector{m.State, m.Received, m.Appended, m.Bytes, m.Duplicates, m.Dropped, m.Errors,
		m.Reconnects, m.Pending, m.Lag, m.LastReceived, m.AppendLatency}
}

// sourceMetrics are one source's children.
type sourceMetrics struct {
	m                                     *Metrics
	source                                string
	received, appended, bytes, duplicates prometheus.Counter
	reconnects                            prometheus.Counter
	appendLatency                         prometheus.Observer
	state                                 map[State]prometheus.Gauge
	pending                               prometheus.Gauge
}

func (m *Metrics) forSource(name string) sourceMetrics {
	if m == nil {
		m = NewMetrics(nil)
	}
	st := make(map[State]prometheus.Gauge, len(States))
	for _, s := range States {
		st[s] = m.State.WithLabelValues(name, string(s))
	}
	for _, reason := range []string{"uncaptured", "invalid", "echo"} { // known reasons show 0, not nothing
		m.Dropped.WithLabelValues(name, reason)
	}
	return sourceMetrics{
		m: m, source: name,
		received: m.Received.WithLabelValues(name), appended: m.Appended.WithLabelValues(name),
		bytes: m.Bytes.WithLabelValues(name), duplicates: m.Duplicates.WithLabelValues(name),
		reconnects:    m.Reconnects.WithLabelValues(name),
		appendLatency: m.AppendLatency.WithLabelValues(name),
		state:         st,
		pending:       m.Pending.WithLabelValues(name),
	}
}

func (sm sourceMetrics) errors(reason string) prometheus.Counter {
	return sm.m.Errors.WithLabelValues(sm.source, reason)
}

func (sm sourceMetrics) dropped(reason string) prometheus.Counter {
	return sm.m.Dropped.WithLabelValues(sm.source, reason)
}

// set updates the gauges from a status; only the monitor calls it.
func (sm sourceMetrics) set(st Status) {
	for s, g := range sm.state {
		if s == st.State {
			g.Set(1)
		} else {
			g.Set(0)
		}
	}
	sm.pending.Set(float64(st.Pending))
	if st.LagRecords != nil {
		sm.m.Lag.WithLabelValues(sm.source).Set(float64(*st.LagRecords))
	} else {
		sm.m.Lag.DeleteLabelValues(sm.source)
	}
	if st.LastReceived != nil {
		sm.m.LastReceived.WithLabelValues(sm.source).Set(float64(st.LastReceived.UnixNano()) / 1e9)
	}
}

// forget removes every series of the source: a source that no longer
// runs shows nothing rather than its last values.
func (sm sourceMetrics) forget() {
	l := prometheus.Labels{"source": sm.source}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{sm.m.State, sm.m.Received, sm.m.Appended, sm.m.Bytes, sm.m.Duplicates, sm.m.Dropped, sm.m.Errors,
		sm.m.Reconnects, sm.m.Pending, sm.m.Lag, sm.m.LastReceived, sm.m.AppendLatency} {
		v.DeletePartialMatch(l)
	}
}
