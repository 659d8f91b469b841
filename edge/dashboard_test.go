package edge

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// dashboardPath is the Grafana dashboard users import.
const dashboardPath = "../configs/grafana-dashboard.json"

// dashboard is what the test reads of a Grafana dashboard.
type dashboard struct {
	Templating struct {
		List []struct {
			Name, Type string
			Query      any
			Definition string
		}
	}
	Panels []dashPanel
}

type dashPanel struct {
	Title      string
	Type       string
	Datasource *struct{ Type, UID string }
	Targets    []struct{ Expr string }
	Panels     []dashPanel // a collapsed row's
}

// seriesName matches the metric names in a PromQL expression that Peat
// itself exports (peat_*) or that its Go and process collectors do.
var seriesName = regexp.MustCompile(`\b(?:peat|process|go)_[a-z0-9_]+\b`)

// Every series the dashboard queries exists on a live node's /metrics:
// a renamed metric breaks this test, not a user's dashboard.
func TestDashboard_EverySeriesExists(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var dsVar bool
	queries := map[string]string{} // query -> where
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" {
			dsVar = true
		}
		if v.Definition != "" {
			queries[v.Definition] = "variable " + v.Name
		}
	}
	if !dsVar {
		t.Errorf("%s has no datasource variable", dashboardPath)
	}
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q does not use the datasource variable", p.Title)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				queries[tg.Expr] = "panel " + p.Title
			}
		}
	}
	walk(d.Panels)

	// A node with traffic: a subscriber, a group behind, and a sink and
	// a source whose upstream (a closed port) is down.
	cfg := sinkConfig(t, closedAddr(t))
	cfg.Sources = sourceConfig(t, closedAddr(t)).Sources
	n := startNode(t, cfg)
	sub := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).SetClientID("sub").SetAutoReconnect(false))
	if tok := sub.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer sub.Disconnect(0)
	got := make(chan struct{}, 100)
	if tok := sub.Subscribe("sensors/#", 1, func(paho.Client, paho.Message) { got <- struct{}{} }); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 5)
	for range 5 {
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatal("the subscriber got no delivery")
		}
	}
	commitOffset(t, n, "billing", "default", 2)
	eventually(t, "the source's first failure", func() bool {
		_, _, body := get(t, "GET", "http://"+n.HTTPAddr().String()+"/metrics")
		return strings.Contains(string(body), "peat_source_errors_total{")
	})

	exported := map[string]bool{}
	scrapeNames(t, n, exported)
	// The cluster's series exist on a site node only (sinks do not run
	// in a site yet): a site of one, once it leads its stream (the
	// replicas' lag is the leader's to report, once its leadership runs).
	site := startNode(t, siteConfig(t, "n1", 1))
	testwait.Eventually(t, "the site's default stream led here", func() bool {
		ok, _ := site.site.Load().CaughtUp()
		for _, x := range site.site.Load().Status().Streams {
			if x.Name == "default" && len(x.ReplicaLag) > 0 {
				return ok
			}
		}
		return false
	})
	scrapeNames(t, site, exported)
	checked := 0
	for q, where := range queries {
		for _, name := range seriesName.FindAllString(q, -1) {
			checked++
			if !exported[name] {
				t.Errorf("%s queries %s, which a live node does not export", where, name)
			}
		}
	}
	if checked < 15 {
		t.Errorf("only %d series names found in the dashboard's queries", checked)
	}
}

// scrapeNames adds the series names n's /metrics exports to names.
func scrapeNames(t *testing.T, n *Node, names map[string]bool) {
	t.Helper()
	_, _, body := get(t, "GET", "http://"+n.HTTPAddr().String()+"/metrics")
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		names[line[:strings.IndexAny(line, "{ ")]] = true
	}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
