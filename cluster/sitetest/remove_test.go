package sitetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// siteView is the part of GET /api/v1/cluster the tests read.
type siteView struct {
	Voters    []string `json:"voters"`
	NonVoters []string `json:"non_voters"`
	Members   []struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		Removal string `json:"removal"`
	} `json:"members"`
	Streams []streamView `json:"streams"`
}

// streamView is a stream in siteView.
type streamView struct {
	Name              string   `json:"name"`
	Leader            string   `json:"leader"`
	Version           uint64   `json:"version"`
	Replicas          []string `json:"replicas"`
	ISR               []string `json:"isr"`
	ReplicationFactor int      `json:"replication_factor"`
}

func (nd *node) view() (siteView, error) {
	var v siteView
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + nd.http + "/api/v1/cluster")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET /api/v1/cluster: %s", resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// peatCmd runs the peat binary's command line (as the operator would).
func peatCmd(args ...string) (string, error) {
	name := binPath
	if *execFlag != "" {
		name, args = *execFlag, append([]string{binPath}, args...)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// A Pi dies for good: three voters and a spare broker under load, kill -9
// of a voter holding a replica, `peat cluster remove-node` on another
// node. The stream's replicas become the three alive nodes with a full
// ISR, the dead voter leaves the quorum and the member list, publishing
// goes on, and every acknowledged message is on the three replicas,
// identical.
func TestSite_RemoveDeadNode(t *testing.T) {
	needSite(t)
	st := streamSpec{"load", "load/#"}
	s := newSiteOf(t, 3, 1, st)
	var replicas []string
	testwait.EventuallyWithin(t, wait(60*time.Second), "the stream on three replicas in sync, seen by the spare", func() bool {
		v, err := s.nodes[3].view()
		if err != nil || len(v.Streams) != 2 { // load, then the site's sessions' stream (listed last)
			return false
		}
		replicas = v.Streams[0].Replicas
		return len(v.Streams[0].ISR) == 3 && len(v.Members) == 4
	})
	ctl := s.controller()
	var victim *node
	for _, nd := range s.nodes[:3] { // a voter, holding a replica, not the controller
		if nd != ctl && slices.Contains(replicas, nd.id) {
			victim = nd
			break
		}
	}
	var alive []*node
	for _, nd := range s.nodes {
		if nd != victim {
			alive = append(alive, nd)
		}
	}
	l := startLoad(t, s, "rm", st.topic(), 1)
	l.waitResumed(time.Now().Add(-time.Hour), 50)

	killAt := time.Now()
	victim.kill()
	t.Logf("replicas %v: kill -9 %s", replicas, victim.id)
	testwait.EventuallyWithin(t, wait(30*time.Second), victim.id+" failed in the member list", func() bool {
		v, err := ctl.view()
		if err != nil {
			return false
		}
		for _, m := range v.Members {
			if m.ID == victim.id {
				return m.State == "failed"
			}
		}
		return false
	})
	l.waitResumed(killAt, 20)

	out, err := peatCmd("cluster", "remove-node", "--http", s.nodes[3].http, victim.id)
	if err != nil || !strings.Contains(out, "moving its replicas of ") || !strings.Contains(out, "load") {
		t.Fatalf("peat cluster remove-node %s: %v\n%s", victim.id, err, out)
	}
	removedAt := time.Now()
	var ids []string
	for _, nd := range alive {
		ids = append(ids, nd.id)
	}
	testwait.EventuallyWithin(t, wait(60*time.Second), fmt.Sprintf("replicas and ISR %v, %s out of the voters and members, on every node", ids, victim.id), func() bool {
		for _, nd := range alive {
			v, err := nd.view()
			if err != nil || len(v.Streams) != 2 || slices.Contains(v.Voters, victim.id) || len(v.Voters) != 2 {
				return false
			}
			for _, x := range v.Streams { // the load and the sessions' stream
				if x.Leader == "" || !slices.Equal(slices.Sorted(slices.Values(x.Replicas)), ids) ||
					!slices.Equal(slices.Sorted(slices.Values(x.ISR)), ids) {
					return false
				}
			}
			for _, m := range v.Members {
				if m.ID == victim.id && m.State == "failed" {
					return false
				}
			}
		}
		return true
	})
	t.Logf("moved to %v %v after remove-node", ids, time.Since(removedAt).Round(time.Millisecond))
	if out, err := peatCmd("cluster", "--http", alive[0].http); err != nil {
		t.Errorf("peat cluster after the move: %v (want exit 0: every stream in sync)\n%s", err, out)
	}
	l.waitResumed(time.Now(), 50)
	l.stop()
	t.Logf("producers: %s", l.summary())
	s.nodes = alive // the checks read every node that runs
	s.check(st, l)
}

// A Pi is retired while it runs: three voters and a spare broker under
// load from every node, `peat cluster remove-node` of the stream's
// leader. It keeps serving while its replica moves to the spare and its
// leadership to an in-sync replica, leaves the voters, and shows
// drained; stopped (SIGTERM), it leaves the member list. Every
// acknowledged message is on the three replicas, identical.
func TestSite_RemoveLiveNode(t *testing.T) {
	needSite(t)
	st := streamSpec{"load", "load/#"}
	s := newSiteOf(t, 3, 1, st)
	spare := s.nodes[3]
	testwait.EventuallyWithin(t, wait(60*time.Second), "the stream on three replicas in sync, seen by the spare", func() bool {
		v, err := spare.view()
		return err == nil && len(v.Streams) == 2 && len(v.Streams[0].ISR) == 3 && len(v.Members) == 4
	})
	victim := s.leader(st.name)
	var rest []string
	for _, nd := range s.nodes {
		if nd != victim {
			rest = append(rest, nd.id)
		}
	}
	slices.Sort(rest)
	l := startLoad(t, s, "drain", st.topic(), 1)
	l.waitResumed(time.Now().Add(-time.Hour), 50)

	out, err := peatCmd("cluster", "remove-node", "--http", spare.http, victim.id)
	if err != nil || !strings.Contains(out, "draining "+victim.id) {
		t.Fatalf("peat cluster remove-node %s (running): %v\n%s", victim.id, err, out)
	}
	drainedAt := time.Now()
	testwait.EventuallyWithin(t, wait(60*time.Second), fmt.Sprintf("replicas and ISR %v, %s drained and out of the voters, on every node", rest, victim.id), func() bool {
		for _, nd := range s.nodes {
			v, err := nd.view()
			if err != nil || len(v.Streams) != 2 || v.Streams[0].Leader == "" ||
				!slices.Equal(slices.Sorted(slices.Values(v.Streams[0].Replicas)), rest) ||
				!slices.Equal(slices.Sorted(slices.Values(v.Streams[0].ISR)), rest) || slices.Contains(v.Voters, victim.id) {
				return false
			}
			for _, m := range v.Members {
				if m.ID == victim.id && (m.Removal != "drained" || m.State != "alive") {
					return false
				}
			}
		}
		return true
	})
	t.Logf("drained %v after remove-node", time.Since(drainedAt).Round(time.Millisecond))
	l.waitResumed(time.Now(), 50)
	if out, err := peatCmd("cluster", "--http", spare.http); err != nil || !strings.Contains(out, "drained: stop it") {
		t.Errorf("peat cluster with a drained member: %v\n%s", err, out)
	}

	victim.stop()
	var alive []*node
	for _, nd := range s.nodes {
		if nd != victim {
			alive = append(alive, nd)
		}
	}
	testwait.EventuallyWithin(t, wait(60*time.Second), victim.id+" out of Raft and the member list, on every node", func() bool {
		for _, nd := range alive {
			v, err := nd.view()
			if err != nil || slices.Contains(v.Voters, victim.id) || slices.Contains(v.NonVoters, victim.id) {
				return false
			}
			for _, m := range v.Members {
				if m.ID == victim.id && m.State == "failed" {
					return false
				}
			}
		}
		return true
	})
	l.waitResumed(time.Now(), 50)
	l.stop()
	t.Logf("producers: %s", l.summary())
	s.nodes = alive
	s.check(st, l)
}
