package rules

import "time"

// PlanLeaders is leader balancing's rule (Kafka's preferred replica
// election, run by the cluster's controller): the first stream (in
// name order) whose preferred replica has been eligible since at least
// after, and when the next one is due. since is updated: a stream enters
// it when its preferred replica is first seen eligible, and leaves it
// when it is not.
func PlanLeaders(st *State, since map[string]time.Time, now time.Time, after time.Duration,
	skip func(string) bool) (elect *ElectLeader, next time.Time) {
	for _, name := range st.StreamNames() {
		x := st.Streams[name]
		p := preferredLeader(st, x)
		if p == "" || x.Leader == "" || x.Leader == p || !st.Alive(p) || !x.InISR(p) || skip(name) {
			delete(since, name)
			continue
		}
		t, ok := since[name]
		if !ok {
			t = now
			since[name] = now
		}
		due := t.Add(after)
		if !now.Before(due) && elect == nil {
			elect = &ElectLeader{Name: name, Preferred: p}
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return elect, next
}

// preferredLeader is the stream's first replica that is not leaving the
// site ("" for none).
func preferredLeader(st *State, x *Stream) string {
	for _, r := range x.Replicas {
		if !st.Leaving(r) {
			return r
		}
	}
	return ""
}
