package cluster

import (
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// watchControllers counts, for ControllerChanges, the controllers this
// node learns of, until the node closes. A count is (controller, Raft
// term): a follower that loses the leader for a moment and hears it again
// in the same term counts nothing, a controller elected again in a new
// term counts once.
func (s *Site) watchControllers() {
	n := s.Node
	// Raft drops an observation when the channel is full rather than
	// block; leadership changes are rare and the buffer generous.
	ch := make(chan raft.Observation, 64)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.raft.RegisterObserver(obs)
	var lastID string
	var lastTerm uint64
	note := func(id string) {
		if id == "" {
			return
		}
		term := n.raft.CurrentTerm()
		if id != lastID || term != lastTerm {
			lastID, lastTerm = id, term
			s.controllerChanges.Add(1)
		}
	}
	note(n.Controller()) // one elected before the observer was registered
	go func() {
		defer n.raft.DeregisterObserver(obs)
		for {
			select {
			case <-n.stop:
				return
			case o := <-ch:
				note(string(o.Data.(raft.LeaderObservation).LeaderID))
			}
		}
	}()
}

// ControllerChanges is how many controllers this node has learned of
// since it started (the first one included).
func (s *Site) ControllerChanges() uint64 { return s.controllerChanges.Load() }

// Collector reports a site node's metrics at scrape time from Status, so
// nothing is counted twice and a series goes when its stream or replica
// does. site returns the running Site, nil outside a site (no series).
type Collector struct {
	site func() *Site
}

// NewCollector makes the collector; register it on the node's registry.
func NewCollector(site func() *Site) *Collector { return &Collector{site: site} }

var (
	descMembers = prometheus.NewDesc("peat_cluster_members",
		"Site members by Serf state (alive, leaving, left, failed), as this node sees them.", []string{"state"}, nil)
	descIsController = prometheus.NewDesc("peat_cluster_is_controller",
		"1 while this node is the controller (the Raft leader), else 0.", nil, nil)
	descControllerChanges = prometheus.NewDesc("peat_cluster_controller_changes_total",
		"Controllers this node has learned of since it started (a new node, or the same one in a new Raft term).", nil, nil)
	descCaughtUp = prometheus.NewDesc("peat_cluster_caught_up",
		"1 while this node knows a controller, is registered in its broker epoch and is in the ISR of every stream it replicates (/readyz), else 0.", nil, nil)
	descElections = prometheus.NewDesc("peat_cluster_leader_elections_total",
		"Leader changes of the stream since it was created, its first leader included (its leader epoch; going offline counts as one).", []string{"stream"}, nil)
	descISR = prometheus.NewDesc("peat_stream_isr_size",
		"Members of the stream's in-sync replica set.", []string{"stream"}, nil)
	descReplicas = prometheus.NewDesc("peat_stream_replicas",
		"Replicas the stream is assigned.", []string{"stream"}, nil)
	descUnder = prometheus.NewDesc("peat_stream_under_replicated",
		"1 while the stream's ISR is smaller than its replica set, else 0.", []string{"stream"}, nil)
	descLag = prometheus.NewDesc("peat_replica_lag_records",
		"Records the replica lacks of its leader's log, reported by the node leading the stream.", []string{"stream", "replica"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMembers, descIsController, descControllerChanges, descCaughtUp,
		descElections, descISR, descReplicas, descUnder, descLag} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.site()
	if s == nil {
		return
	}
	st := s.Status()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	states := map[string]int{"alive": 0, "failed": 0, "left": 0}
	for _, m := range st.Members {
		states[m.State]++
	}
	for state, k := range states {
		gauge(descMembers, float64(k), state)
	}
	gauge(descIsController, b2f(st.IsController))
	gauge(descCaughtUp, b2f(st.Ready))
	ch <- prometheus.MustNewConstMetric(descControllerChanges, prometheus.CounterValue, float64(st.ControllerChanges))
	for _, x := range st.Streams {
		ch <- prometheus.MustNewConstMetric(descElections, prometheus.CounterValue, float64(x.LeaderEpoch), x.Name)
		gauge(descISR, float64(len(x.ISR)), x.Name)
		gauge(descReplicas, float64(len(x.Replicas)), x.Name)
		gauge(descUnder, b2f(x.UnderReplicated), x.Name)
		for _, r := range x.ReplicaLag {
			gauge(descLag, float64(r.LagRecords), x.Name, r.ID)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
