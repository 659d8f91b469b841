package sitetest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// replica is one node's committed records of a stream: payload by offset.
type replica []string

// settle waits until every node reports the same committed offset of
// stream, twice in a row, and returns it.
func (s *site) settle(stream string) uint64 {
	s.t.Helper()
	return s.settleOn(stream, s.nodes)
}

// settleOn is settle on some nodes.
func (s *site) settleOn(stream string, nodes []*node) uint64 {
	s.t.Helper()
	var last []uint64
	var agreed uint64
	testwait.EventuallyWithin(s.t, wait(2*time.Minute), "every node to report the same committed offset of "+stream, func() bool {
		var now []uint64
		for _, nd := range nodes {
			c, err := nd.committed(stream)
			if err != nil {
				return false
			}
			now = append(now, c)
		}
		same := fmt.Sprint(now) == fmt.Sprint(last)
		last = now
		for _, c := range now[1:] {
			if c != now[0] {
				return false
			}
		}
		agreed = now[0]
		return same
	})
	return agreed
}

// read reads offsets [0, end) of stream from the node through MQTT,
// $replay/0/+/<filter> at QoS 0: what a subscriber on that node sees.
func (nd *node) read(tb testing.TB, st streamSpec, end uint64) replica {
	tb.Helper()
	out := make(replica, 0, end)
	for _, r := range nd.replay(tb, st, end) {
		out = append(out, r.payload)
	}
	return out
}

// replayed is one record as a $replay subscriber gets it.
type replayed struct{ topic, payload string }

// replay is read with each record's original topic.
func (nd *node) replay(tb testing.TB, st streamSpec, end uint64) []replayed {
	tb.Helper()
	c, err := dial(nd.mqtt, "check-"+nd.id+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), 5)
	if err != nil {
		tb.Fatalf("%s: %v", nd.id, err)
	}
	defer c.close()
	if err := c.subscribe("$replay/0/+/"+st.filter, 0); err != nil {
		tb.Fatalf("%s: %v", nd.id, err)
	}
	out := make([]replayed, 0, end)
	for uint64(len(out)) < end {
		pk, err := c.readTimeout(wait(30 * time.Second))
		if err != nil {
			tb.Fatalf("%s: replay of %s stopped at %d of %d records: %v", nd.id, st.name, len(out), end, err)
		}
		// $replay/0/<offset>/<topic>
		parts := strings.SplitN(pk.TopicName, "/", 4)
		if len(parts) != 4 {
			tb.Fatalf("%s: replayed topic %q", nd.id, pk.TopicName)
		}
		off, err := strconv.ParseUint(parts[2], 10, 64)
		if err != nil {
			tb.Fatalf("%s: replayed topic %q: %v", nd.id, pk.TopicName, err)
		}
		if off != uint64(len(out)) {
			tb.Fatalf("%s: replay of %s delivered offset %d after %d records: a gap or a reordering", nd.id, st.name, off, len(out))
		}
		out = append(out, replayed{topic: parts[3], payload: string(pk.Payload)})
	}
	return out
}

// check settles stream, reads every node's replica and asserts that they
// are identical, hold every acknowledged message, and hold a message
// acknowledged on its first attempt exactly once. It returns the
// replica.
func (s *site) check(st streamSpec, loads ...*load) replica {
	s.t.Helper()
	r, _ := s.checkOn(st, s.nodes, loads...)
	return r
}

// checked is what check found: records, and how many acknowledged
// messages are on no replica (lost) and offsets where replicas differ
// (divergent: at most one per replica, the first).
type checked struct{ records, lost, divergent, dups int }

// checkOn is check of the replicas on nodes (those that hold one: in a
// site of more nodes than replicas the others have none).
func (s *site) checkOn(st streamSpec, nodes []*node, loads ...*load) (replica, checked) {
	s.t.Helper()
	end := s.settleOn(st.name, nodes)
	var replicas []replica
	for _, nd := range nodes {
		replicas = append(replicas, nd.read(s.t, st, end))
	}
	msgs := map[string]msgState{}
	for _, l := range loads {
		l.ledger.mu.Lock()
		for p, m := range l.ledger.mu.msgs {
			msgs[p] = *m
		}
		l.ledger.mu.Unlock()
	}
	problems, dups := judge(replicas, msgs)
	res := checked{records: int(end), dups: dups}
	for _, p := range problems {
		s.t.Errorf("%s: %s", st.name, p)
		switch {
		case strings.Contains(p, "is on no replica"):
			res.lost++
		case strings.Contains(p, "diverge"), strings.Contains(p, "holds"):
			res.divergent++
		}
	}
	s.t.Logf("%s: %d records, identical on %d replicas; %d retried messages stored more than once (at least once)",
		st.name, end, len(nodes), dups)
	return replicas[0], res
}

// judge compares replicas (of equal length) offset by offset and with
// what the producers know of each message; it returns what is wrong and
// how many messages are stored more than once.
func judge(replicas []replica, msgs map[string]msgState) (problems []string, dups int) {
	if len(replicas) == 0 {
		return []string{"no replica read"}, 0
	}
	first := replicas[0]
	for i, r := range replicas[1:] {
		if len(r) != len(first) {
			problems = append(problems, fmt.Sprintf("replica %d holds %d records, replica 0 %d", i+1, len(r), len(first)))
		}
		for off := range min(len(r), len(first)) {
			if r[off] != first[off] {
				problems = append(problems, fmt.Sprintf("offset %d: %q on replica 0, %q on replica %d: the replicas diverge",
					off, first[off], r[off], i+1))
				break
			}
		}
	}
	count := map[string]int{}
	for _, p := range first {
		count[p]++
	}
	for p, m := range msgs {
		switch {
		case m.acked && count[p] == 0:
			problems = append(problems, fmt.Sprintf("%s was acknowledged (after %d attempts) and is on no replica", p, m.attempts))
		case m.first && count[p] != 1:
			problems = append(problems, fmt.Sprintf("%s was acknowledged on its first attempt and is stored %d times", p, count[p]))
		case count[p] > 1:
			dups++
		}
	}
	slices.Sort(problems)
	return problems, dups
}
