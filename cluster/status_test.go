package cluster

import (
	"strings"
	"testing"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestReadiness(t *testing.T) {
	st := func(b *rules.Broker, isr ...string) *rules.State {
		s := rules.NewState()
		if b != nil {
			s.Brokers[b.ID] = b
		}
		s.Streams["a"] = &rules.Stream{Name: "a", Replicas: []string{"n1", "n2"}, Leader: "n2", ISR: isr}
		s.Streams["b"] = &rules.Stream{Name: "b", Replicas: []string{"n2", "n3"}, Leader: "n2", ISR: []string{"n2"}}
		return s
	}
	for _, tc := range []struct {
		name       string
		state      *rules.State
		controller string
		cutOff     bool
		want       string // "" ready, else a part of the reason
	}{
		{"in every ISR", st(&rules.Broker{ID: "n1", Epoch: 7, Alive: true}, "n1", "n2"), "n2", false, ""},
		{"outside an ISR", st(&rules.Broker{ID: "n1", Epoch: 7, Alive: true}, "n2"), "n2", false, "outside the ISR (catching up) of stream(s) a"},
		{"no controller", st(&rules.Broker{ID: "n1", Epoch: 7, Alive: true}, "n1", "n2"), "", false, "no controller known"},
		{"cut off from the controller", st(&rules.Broker{ID: "n1", Epoch: 7, Alive: true}, "n1", "n2"), "n2", true, "cut off from the controller n2"},
		{"old epoch", st(&rules.Broker{ID: "n1", Epoch: 6, Alive: true}, "n1", "n2"), "n2", false, "not registered this node's broker epoch 7"},
		{"not registered", st(nil, "n2"), "n2", false, "not registered"},
		{"counted failed", st(&rules.Broker{ID: "n1", Epoch: 7}, "n2"), "n2", false, "counts this node as failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, why := readiness(tc.state, "n1", 7, tc.controller, !tc.cutOff)
			switch {
			case tc.want == "" && (!ok || why != ""):
				t.Fatalf("not ready: %s", why)
			case tc.want != "" && (ok || !strings.Contains(why, tc.want)):
				t.Fatalf("ready %v, reason %q; want not ready with %q", ok, why, tc.want)
			}
		})
	}
}

// startSites starts n site nodes on loopback (n voters), each watching
// its controllers, and waits until the default stream has a full ISR.
// startSites starts a site of n voters (newTestSite, with the default
// replica lag) and waits until every node has the default stream with a
// full ISR.
func startSites(t *testing.T, n int) []*Site {
	t.Helper()
	var sites []*Site
	for _, tn := range newTestSite(t, siteOpts{Voters: n, LagMax: DefaultReplicaLagMax}).nodes {
		sites = append(sites, tn.Site)
	}
	// Every node, not only the first: each applies the state on its own.
	eventually(t, "the default stream with a full ISR on every node", func() bool {
		for _, site := range sites {
			full := false
			for _, s := range site.Status().Streams {
				full = full || (s.Name == "default" && len(s.ISR) == n)
			}
			if !full {
				return false
			}
		}
		return true
	})
	return sites
}

// gather is the collector's series by name and label values.
func gather(t *testing.T, s *Site) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(func() *Site { return s }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += " " + l.GetName() + "=" + l.GetValue()
			}
			out[key] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// Every node counts the controller it learned of; when the controller
// dies, the others count the new one, and its failure shows in the
// members and the streams' ISR.
func TestSite_ControllerChangesAndMetrics(t *testing.T) {
	sites := startSites(t, 3)
	var ctl *Site
	var rest []*Site
	eventually(t, "one controller all agree on", func() bool {
		ctl, rest = nil, nil
		for _, s := range sites {
			st := s.Status()
			if st.Controller == "" || st.Controller != sites[0].Node.Controller() {
				return false
			}
			if st.IsController {
				ctl = s
			} else {
				rest = append(rest, s)
			}
		}
		return ctl != nil
	})
	before := map[*Site]float64{}
	for _, s := range sites {
		m := gather(t, s)
		if m["peat_cluster_controller_changes_total"] < 1 {
			t.Fatalf("%s: controller changes %v, want the first controller counted", s.Node.ID(), m["peat_cluster_controller_changes_total"])
		}
		before[s] = m["peat_cluster_controller_changes_total"]
		if want := map[bool]float64{true: 1, false: 0}[s == ctl]; m["peat_cluster_is_controller"] != want {
			t.Errorf("%s: peat_cluster_is_controller %v, want %v", s.Node.ID(), m["peat_cluster_is_controller"], want)
		}
		if m["peat_stream_isr_size stream=default"] != 3 || m["peat_stream_replicas stream=default"] != 3 ||
			m["peat_stream_under_replicated stream=default"] != 0 || m["peat_cluster_members state=alive"] != 3 {
			t.Errorf("%s: series %v", s.Node.ID(), m)
		}
	}

	old := ctl.Node.ID()
	if err := ctl.Node.Close(); err != nil { // a crash, as far as the others can tell
		t.Fatal(err)
	}
	eventually(t, "a new controller, and "+old+" failed and out of the ISR", func() bool {
		for _, s := range rest {
			st := s.Status()
			if st.Controller == "" || st.Controller == old {
				return false
			}
			m := gather(t, s)
			if m["peat_cluster_members state=failed"] != 1 || m["peat_stream_isr_size stream=default"] != 2 ||
				m["peat_stream_under_replicated stream=default"] != 1 {
				return false
			}
		}
		return true
	})
	for _, s := range rest {
		if got := gather(t, s)["peat_cluster_controller_changes_total"]; got <= before[s] {
			t.Errorf("%s: controller changes %v after a new controller, was %v", s.Node.ID(), got, before[s])
		}
	}
}
