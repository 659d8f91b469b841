package sink

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// scrape serves reg at /metrics and returns a function that reads the
// peat_sink_* lines of sink s there, as a Prometheus server would.
func scrape(t *testing.T, reg *prometheus.Registry) func() []string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return func() []string {
		t.Helper()
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "peat_sink_") && strings.Contains(line, `sink="s"`) {
				out = append(out, line)
			}
		}
		return out
	}
}

func hasSeries(lines []string, prefix string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

// TestSink_MetricsOfAStreamLedElsewhere: in a site, once the stream's
// leadership moves to another node, this node's /metrics shows the
// stream on standby, without lag and without the time of its own last
// acknowledgement (the new leader's are newer); leadership coming back
// shows no last success until a new acknowledgement. A stream removed
// from the sink, then the sink stopped, leave no series behind.
func TestSink_MetricsOfAStreamLedElsewhere(t *testing.T) {
	log := mqtttest.NewMemLog(t, "default=#")
	st := log.Stream(t, "default")
	appendRecs(t, st, 20)
	up := &fakeUpstream{window: 4, conns: make(chan *fakeConn)}
	pos := &mapPositions{m: map[string]uint64{}}
	ld := newFakeLeadership("here")
	reg := prometheus.NewRegistry()
	s, err := New(Config{Name: "s", Streams: []Stream{st}, Upstream: up, Positions: pos, Leadership: ld,
		BackoffMin: time.Millisecond, BackoffMax: time.Millisecond, StallAfter: 40 * time.Millisecond,
		Metrics: NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	lines := scrape(t, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	c := <-up.conns
	for _, d := range c.take(t, 4) {
		c.acks <- d.ID
	}
	waitPos(t, pos, 4)
	const lastSuccess = `peat_sink_last_success_timestamp_seconds{sink="s",stream="default"}`
	testwait.Eventually(t, "the last success and the lag on /metrics", func() bool {
		l := lines()
		return hasSeries(l, lastSuccess) && hasSeries(l, `peat_sink_lag_records{sink="s",stream="default"} 16`)
	})

	ld.set("n3")
	testwait.Eventually(t, "standby on /metrics", func() bool {
		return hasSeries(lines(), `peat_sink_state{sink="s",state="standby",stream="default"} 1`)
	})
	l := lines()
	if hasSeries(l, lastSuccess) {
		t.Errorf("standby stream still shows this node's last success: %v", l)
	}
	if !hasSeries(l, `peat_sink_lag_records{sink="s",stream="default"} 0`) ||
		!hasSeries(l, `peat_sink_state{sink="s",state="connected",stream="default"} 0`) {
		t.Errorf("standby stream shows lag or the old state: %v", l)
	}

	ld.set("here") // back: nothing acknowledged under this leadership yet
	c = <-up.conns
	got := c.take(t, 1)
	testwait.Eventually(t, "connected on /metrics", func() bool {
		return hasSeries(lines(), `peat_sink_state{sink="s",state="connected",stream="default"} 1`)
	})
	if l := lines(); hasSeries(l, lastSuccess) {
		t.Errorf("the stream shows a last success from its former leadership: %v", l)
	}
	c.acks <- got[0].ID
	testwait.Eventually(t, "the new last success on /metrics", func() bool { return hasSeries(lines(), lastSuccess) })

	s.RemoveStream("default")
	testwait.Eventually(t, "the removed stream's series gone", func() bool {
		for _, l := range lines() {
			if strings.Contains(l, `stream="default"`) {
				return false
			}
		}
		return true
	})
	cancel()
	<-done
	if l := lines(); len(l) != 0 {
		t.Errorf("a stopped sink left series on /metrics: %v", l)
	}
}
