package edge

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/status"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Build names the binary a node runs, for the status API and
// peat_build_info.
type Build struct {
	Version string
	Commit  string
}

// The node samples its counters every sampleInterval into a ring of
// historySamples (ten minutes): rates over the last minute and the status
// page's sparklines come from it. A fixed ring costs the same after a
// year of uptime as after a minute.
const (
	sampleInterval = 5 * time.Second
	historySamples = 121
	rateWindow     = time.Minute
)

// errNotServing is the status API's answer before Start and after Close.
var errNotServing = errors.New("the node is not serving")

// SetBuild names the binary for the status API and peat_build_info; call
// it before Start.
func (n *Node) SetBuild(b Build) {
	n.build.Store(&b)
}

func (n *Node) buildInfo() Build {
	if b := n.build.Load(); b != nil {
		return *b
	}
	return Build{Version: "dev", Commit: "dev"}
}

// sample reads the counters the rates and the history are made of.
func (n *Node) sample(now time.Time, groups []status.Group) status.Sample {
	s := status.Sample{
		At:        now,
		Published: sumCounters(n.mqttMetrics.Received),
		Delivered: sumCounters(n.mqttMetrics.Delivered),
		Refused:   sumCounters(n.mqttMetrics.Refused),
	}
	for _, g := range groups {
		if g.LagRecords != nil {
			s.MaxGroupLag = max(s.MaxGroupLag, float64(*g.LagRecords))
		}
	}
	return s
}

// sampleLoop is the sampler's goroutine, started by Start and stopped by
// shutdown.
func (n *Node) sampleLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(sampleInterval)
	defer t.Stop()
	n.history.Add(n.sample(time.Now(), n.groupStatus(time.Now(), false)))
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n.history.Add(n.sample(now, n.groupStatus(now, false)))
		}
	}
}

// Status makes the node's status document (GET /api/v1/status).
func (n *Node) Status() (*status.Status, error) {
	store, broker := n.store.Load(), n.broker.Load()
	if store == nil || broker == nil || !n.serving.Load() {
		return nil, errNotServing
	}
	now := time.Now()
	b := n.buildInfo()
	host, _ := os.Hostname()
	st := &status.Status{
		Node: status.Node{
			ID: host, Version: b.Version, Commit: b.Commit, GoVersion: runtime.Version(),
			Profile: string(store.Profile()), DataDir: n.cfg.DataDir,
			StartedAt: n.started, UptimeSeconds: now.Sub(n.started).Seconds(), Time: now.UTC(),
		},
		Listeners: []status.Listener{{Protocol: "mqtt", Address: addrString(broker.Addr())}},
		Clients:   status.Clients{Connected: broker.Clients()},
		Groups:    n.groupStatus(now, true),
	}
	if a := n.HTTPAddr(); a != nil {
		st.Listeners = append(st.Listeners, status.Listener{Protocol: "http", Address: a.String()})
	}
	samples := n.history.Samples()
	st.Rates = status.RatesSince(samples, n.sample(now, st.Groups), rateWindow)
	st.History = status.HistoryOf(samples, sampleInterval)
	for _, s := range store.Streams() {
		st.Streams = append(st.Streams, streamStatus(s, now))
	}
	if st.Streams == nil {
		st.Streams = []status.Stream{}
	}
	ss := broker.Sessions()
	st.Sessions = status.Sessions{Durable: ss.Count, Connected: ss.Connected,
		MaxLagRecords: ss.MaxLag, MaxLagClient: ss.MaxLagClient, MaxLagStream: ss.MaxLagStream}
	sp := store.Space()
	st.Disk = status.Disk{Dir: sp.Dir, Known: sp.Known, FreeBytes: sp.Free, SizeBytes: sp.Size,
		ReserveBytes: sp.Reserve, Refusing: sp.Refusing}
	st.Sinks = n.sinkSummaries()
	st.Sources = n.sourceSummaries(now)
	st.Alarms = append(n.alarms(sp), sinkAlarms(st.Sinks)...)
	st.Alarms = append(st.Alarms, sourceAlarms(st.Sources)...)
	st.Cluster = n.clusterStatus()
	st.Alarms = append(st.Alarms, clusterAlarms(st.Cluster)...)
	return st, nil
}

// sinkSummaries sums up each sink over its streams.
func (n *Node) sinkSummaries() []status.Sink {
	out := []status.Sink{}
	set := n.sinks.Load()
	if set == nil {
		return out
	}
	for _, s := range set.list {
		st := set.status(s)
		sum := status.Sink{Name: st.Name, Kind: st.Kind, Upstream: st.Upstream, State: string(st.State), LastError: st.LastError}
		for _, ss := range st.Streams {
			sum.LagRecords += ss.LagRecords
			sum.LagSeconds = max(sum.LagSeconds, ss.LagSeconds)
			if ss.LastSuccess != nil && (sum.LastSuccess == nil || ss.LastSuccess.After(*sum.LastSuccess)) {
				at := *ss.LastSuccess
				sum.LastSuccess = &at
			}
		}
		out = append(out, sum)
	}
	return out
}

// sinkAlarms warns of each stalled sink. A warning, not critical: the log
// keeps what the sink has not sent until retention drops it (then the
// sink counts it lost).
func sinkAlarms(sinks []status.Sink) []status.Alarm {
	var out []status.Alarm
	for _, s := range sinks {
		if s.State != string(sink.StateStalled) {
			continue
		}
		msg := fmt.Sprintf("sink %q stalled: %s records for %s not acknowledged, the oldest %s old", s.Name,
			status.FormatCount(float64(s.LagRecords)), s.Upstream, status.FormatDuration(s.LagSeconds))
		if s.LastError != "" {
			msg += "; last error: " + s.LastError
		}
		out = append(out, status.Alarm{ID: status.AlarmSinkStalled, Severity: status.SeverityWarning, Message: msg})
	}
	return out
}

// sourceSummaries sums up each source.
func (n *Node) sourceSummaries(now time.Time) []status.Source {
	out := []status.Source{}
	for _, st := range n.sourceStatuses() {
		sum := status.Source{Name: st.Name, Kind: st.Kind, Upstream: st.Upstream, Stream: st.Stream,
			State: string(st.State), Received: st.Received, LagRecords: st.LagRecords, LastError: st.LastError}
		if st.LastReceived != nil {
			ago := max(now.Sub(*st.LastReceived).Seconds(), 0)
			sum.LastReceivedSeconds = &ago
		}
		out = append(out, sum)
	}
	return out
}

// sourceAlarms warns of each stalled source: the upstream keeps what the
// source has not acknowledged, until its own limits drop it.
func sourceAlarms(sources []status.Source) []status.Alarm {
	var out []status.Alarm
	for _, s := range sources {
		if s.State != string(source.StateStalled) {
			continue
		}
		msg := fmt.Sprintf("source %q stalled: messages from %s wait to be stored in stream %s, and none was stored for its stall_after",
			s.Name, s.Upstream, s.Stream)
		if s.LastError != "" {
			msg += "; last error: " + s.LastError
		}
		out = append(out, status.Alarm{ID: status.AlarmSourceStalled, Severity: status.SeverityWarning, Message: msg})
	}
	return out
}

func streamStatus(s *logstore.Stream, now time.Time) status.Stream {
	cfg := s.Config()
	filters := cfg.Filters
	if filters == nil {
		filters = []string{}
	}
	out := status.Stream{
		Name: s.Name(), Filters: filters,
		FirstOffset: s.FirstOffset(), NextOffset: s.NextOffset(), CommittedOffset: s.Committed(),
		Bytes:     s.Bytes(),
		Retention: status.Retention{MaxAgeSeconds: cfg.MaxAge.Seconds(), MaxBytes: cfg.MaxBytes},
	}
	out.Records = out.NextOffset - min(out.FirstOffset, out.NextOffset)
	if ts, ok := timestampAt(s, out.FirstOffset); ok {
		age := max(now.Sub(time.UnixMilli(ts)).Seconds(), 0)
		out.OldestAgeSeconds = &age
	}
	return out
}

// timestampAt is the append time (unix ms) of the first record at or after
// off that the stream still holds and has committed.
func timestampAt(s *logstore.Stream, off uint64) (int64, bool) {
	off = max(off, s.FirstOffset())
	if off >= s.Committed() {
		return 0, false
	}
	recs, err := s.Read(off, 1, 1)
	if err != nil || len(recs) == 0 {
		return 0, false
	}
	return recs[0].Timestamp, true
}

// groupStatus lists the consumer groups with their lag; withTime also
// reads the first unconsumed record of each for the lag in seconds (one
// read per group, so the sampler and /metrics leave it out).
func (n *Node) groupStatus(now time.Time, withTime bool) []status.Group {
	store, broker := n.store.Load(), n.broker.Load()
	if store == nil || broker == nil {
		return []status.Group{}
	}
	states := broker.Groups()
	out := make([]status.Group, 0, len(states))
	for _, g := range states {
		out = append(out, groupStatusOf(g, store.Stream(g.Stream), now, withTime))
	}
	return out
}

func groupStatusOf(g mqtt.GroupState, s *logstore.Stream, now time.Time, withTime bool) status.Group {
	out := status.Group{Group: g.Group, Stream: g.Stream, Consumer: g.Holder}
	if !g.Known || s == nil {
		return out
	}
	committed := g.Committed
	out.CommittedOffset = &committed
	// Records below the log start are gone: the group cannot be behind
	// by them.
	from := max(committed, s.FirstOffset())
	lag := s.Committed() - min(from, s.Committed())
	out.LagRecords = &lag
	if withTime {
		secs := 0.0
		if ts, ok := timestampAt(s, from); ok && lag > 0 {
			secs = max(now.Sub(time.UnixMilli(ts)).Seconds(), 0)
		}
		out.LagSeconds = &secs
	}
	return out
}

// alarms lists what an operator must act on now.
func (n *Node) alarms(sp logstore.SpaceStatus) []status.Alarm {
	out := []status.Alarm{}
	switch {
	case sp.Refusing && sp.Known && sp.Reserve >= 0 && sp.Free < uint64(sp.Reserve):
		out = append(out, status.Alarm{ID: status.AlarmDiskReserve, Severity: status.SeverityCritical,
			Message: fmt.Sprintf("refusing publishes: %s free in %s, below the %s reserve (storage.min_free_bytes); free space or lower retention",
				humanBytes(sp.Free), sp.Dir, humanBytes(uint64(sp.Reserve)))})
	case sp.Refusing:
		out = append(out, status.Alarm{ID: status.AlarmDiskReserve, Severity: status.SeverityCritical,
			Message: fmt.Sprintf("refusing publishes: the last write to %s found the disk full", sp.Dir)})
	case sp.Known && sp.Reserve >= 0 && sp.Free < 2*uint64(sp.Reserve):
		out = append(out, status.Alarm{ID: status.AlarmDiskLow, Severity: status.SeverityWarning,
			Message: fmt.Sprintf("disk space low: %s free in %s, publishes are refused below %s (storage.min_free_bytes)",
				humanBytes(sp.Free), sp.Dir, humanBytes(uint64(sp.Reserve)))})
	}
	if c := sumCounters(n.storeMetrics.CorruptRecords); c > 0 {
		out = append(out, status.Alarm{ID: status.AlarmCorruptRecords, Severity: status.SeverityWarning,
			Message: fmt.Sprintf("%.0f stored records failed their checksum since start (peat_log_corrupt_records_total; the log names stream and offset)", c)})
	}
	return append(out, n.fileAlarms()...) // filemodes.go
}

// humanBytes is n as the status page writes sizes.
func humanBytes(n uint64) string { return status.FormatBytes(float64(n)) }

// sumCounters adds up every series of a counter vector: the node's
// totals, read without a scrape.
func sumCounters(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) == nil && d.Counter != nil {
			sum += d.Counter.GetValue()
		}
	}
	return sum
}
