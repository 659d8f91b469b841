package logstore

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the log's Prometheus metrics. One Metrics may serve several
// stores (each stream is a label value).
type Metrics struct {
	AppendedRecords  *prometheus.CounterVec   // peat_log_appended_records_total{stream}
	AppendedBytes    *prometheus.CounterVec   // peat_log_appended_bytes_total{stream}
	AppendDuration   *prometheus.HistogramVec // peat_log_append_duration_seconds{stream}
	CommitDuration   *prometheus.HistogramVec // peat_log_commit_duration_seconds{stream}
	BatchRecords     prometheus.Histogram     // peat_log_batch_records
	RetentionDropped *prometheus.CounterVec   // peat_log_retention_dropped_records_total{stream}
	CorruptRecords   *prometheus.CounterVec   // peat_log_corrupt_records_total{stream}
	AppendErrors     *prometheus.CounterVec   // peat_log_append_errors_total{stream,reason}
	Reclaims         prometheus.Counter       // peat_log_reclaims_total
	MappedTrims      prometheus.Counter       // peat_log_mapped_trims_total

	gauges *streamGauges
}

// Reasons of peat_log_append_errors_total.
const (
	reasonNoSpace = "no_space"
	reasonClosed  = "closed"
	reasonTooBig  = "too_large"
	reasonIO      = "io"
	reasonInvalid = "invalid"
)

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	latency := []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	m := &Metrics{
		AppendedRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_log_appended_records_total", Help: "Records appended to the log, by stream.",
		}, []string{"stream"}),
		AppendedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_log_appended_bytes_total", Help: "Bytes (encoded key and value) appended to the log, by stream.",
		}, []string{"stream"}),
		AppendDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "peat_log_append_duration_seconds", Help: "Time from an append request to its records being durable.",
			Buckets: latency,
		}, []string{"stream"}),
		CommitDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "peat_log_commit_duration_seconds", Help: "Duration of one Badger commit (including fsync when synced).",
			Buckets: latency,
		}, []string{"stream"}),
		BatchRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "peat_log_batch_records", Help: "Records per group commit.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}),
		RetentionDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_log_retention_dropped_records_total", Help: "Records dropped by retention, by stream.",
		}, []string{"stream"}),
		CorruptRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_log_corrupt_records_total", Help: "Stored records that failed their checksum or decoding on read.",
		}, []string{"stream"}),
		AppendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peat_log_append_errors_total", Help: "Append requests that failed, by stream and reason.",
		}, []string{"stream", "reason"}),
		Reclaims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "peat_log_reclaims_total", Help: "DropPrefix calls that gave retained-out space back.",
		}),
		MappedTrims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "peat_log_mapped_trims_total", Help: "Times the store handed the pages of Badger's memory-mapped files back to the kernel (storage.mapped_limit).",
		}),
		gauges: &streamGauges{},
	}
	if reg != nil {
		reg.MustRegister(m.AppendedRecords, m.AppendedBytes, m.AppendDuration, m.CommitDuration,
			m.BatchRecords, m.RetentionDropped, m.CorruptRecords, m.AppendErrors, m.Reclaims, m.MappedTrims, m.gauges)
	}
	return m
}

// streamGauges reports offsets and sizes of the attached stores' streams
// at scrape time.
type streamGauges struct {
	mu     sync.Mutex
	stores []*Store
}

var (
	descFirst     = prometheus.NewDesc("peat_log_first_offset", "Log start offset: the oldest offset retention still holds.", []string{"stream"}, nil)
	descNext      = prometheus.NewDesc("peat_log_next_offset", "Log end offset: the next offset to be assigned.", []string{"stream"}, nil)
	descCommitted = prometheus.NewDesc("peat_log_committed_offset", "High watermark: readers see offsets below it.", []string{"stream"}, nil)
	descBytes     = prometheus.NewDesc("peat_log_retained_bytes", "Bytes the retained records of the stream take.", []string{"stream"}, nil)

	// The filesystem of the store's directory (Store.Space), by directory.
	descDiskFree     = prometheus.NewDesc("peat_disk_free_bytes", "Bytes free on the filesystem holding the log (for unprivileged users).", []string{"dir"}, nil)
	descDiskSize     = prometheus.NewDesc("peat_disk_size_bytes", "Size of the filesystem holding the log.", []string{"dir"}, nil)
	descDiskReserve  = prometheus.NewDesc("peat_disk_reserve_bytes", "Free space below which publishes are refused (storage.min_free_bytes, or the profile's reserve scaled to the filesystem).", []string{"dir"}, nil)
	descDiskRefusing = prometheus.NewDesc("peat_disk_refusing", "1 while publishes are refused for lack of disk space, else 0.", []string{"dir"}, nil)
)

func (g *streamGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- descFirst
	ch <- descNext
	ch <- descCommitted
	ch <- descBytes
	ch <- descDiskFree
	ch <- descDiskSize
	ch <- descDiskReserve
	ch <- descDiskRefusing
}

func (g *streamGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	stores := append([]*Store(nil), g.stores...)
	g.mu.Unlock()
	for _, st := range stores {
		for _, s := range st.Streams() {
			ch <- prometheus.MustNewConstMetric(descFirst, prometheus.GaugeValue, float64(s.FirstOffset()), s.name)
			ch <- prometheus.MustNewConstMetric(descNext, prometheus.GaugeValue, float64(s.NextOffset()), s.name)
			ch <- prometheus.MustNewConstMetric(descCommitted, prometheus.GaugeValue, float64(s.Committed()), s.name)
			ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(s.Bytes()), s.name)
		}
		if sp := st.Space(); sp.Known {
			refusing := 0.0
			if sp.Refusing {
				refusing = 1
			}
			ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, float64(sp.Free), sp.Dir)
			ch <- prometheus.MustNewConstMetric(descDiskSize, prometheus.GaugeValue, float64(sp.Size), sp.Dir)
			ch <- prometheus.MustNewConstMetric(descDiskReserve, prometheus.GaugeValue, float64(sp.Reserve), sp.Dir)
			ch <- prometheus.MustNewConstMetric(descDiskRefusing, prometheus.GaugeValue, refusing, sp.Dir)
		}
	}
}

func (g *streamGauges) attach(st *Store) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stores = append(g.stores, st)
}

func (g *streamGauges) detach(st *Store) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, x := range g.stores {
		if x == st {
			g.stores = append(g.stores[:i], g.stores[i+1:]...)
			return
		}
	}
}

// forgetStream deletes the series of a removed stream, so /metrics does not
// show a stream the store no longer has. (Its gauges are read from the
// stream set at each scrape and go by themselves.)
func (m *Metrics) forgetStream(name string) {
	for _, v := range []*prometheus.CounterVec{m.AppendedRecords, m.AppendedBytes, m.RetentionDropped, m.CorruptRecords} {
		v.DeleteLabelValues(name)
	}
	for _, v := range []*prometheus.HistogramVec{m.AppendDuration, m.CommitDuration} {
		v.DeleteLabelValues(name)
	}
	m.AppendErrors.DeletePartialMatch(prometheus.Labels{"stream": name})
}
