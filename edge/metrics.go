package edge

import (
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeCollector reports, at scrape time, what only the node as a whole
// knows: the binary it runs and each consumer group's lag. Groups are few
// and named by operators, so a series per group and stream is bounded;
// clients and sessions get no series of their own (there may be
// thousands).
type nodeCollector struct{ n *Node }

var (
	descBuildInfo = prometheus.NewDesc("peat_build_info", "Always 1; the labels name the running binary.",
		[]string{"version", "commit", "goversion"}, nil)
	descGroupLag = prometheus.NewDesc("peat_group_lag_records", "Committed records a consumer group has not consumed yet, by group and stream.",
		[]string{"group", "stream"}, nil)
	descGroupConsumers = prometheus.NewDesc("peat_group_consumer_connected", "1 while a consumer group has an active consumer in the stream, else 0.",
		[]string{"group", "stream"}, nil)
)

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descBuildInfo
	ch <- descGroupLag
	ch <- descGroupConsumers
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.n.buildInfo()
	ch <- prometheus.MustNewConstMetric(descBuildInfo, prometheus.GaugeValue, 1, b.Version, b.Commit, runtime.Version())
	for _, g := range c.n.groupStatus(time.Now(), false) {
		connected := 0.0
		if g.Consumer != "" {
			connected = 1
		}
		ch <- prometheus.MustNewConstMetric(descGroupConsumers, prometheus.GaugeValue, connected, g.Group, g.Stream)
		if g.LagRecords != nil {
			ch <- prometheus.MustNewConstMetric(descGroupLag, prometheus.GaugeValue, float64(*g.LagRecords), g.Group, g.Stream)
		}
	}
}
