package rules

import (
	"maps"
	"slices"
	"time"
)

// PlanReplacements is cluster.replace_after's rule: the brokers failed
// for at least after, to remove (RemoveBroker), in id order, and when the
// next one is due (zero: none). since is when the caller first saw each
// broker failed, updated here: a broker enters it when first seen failed
// (at now) and leaves it once alive or removed. The count lives in the
// controller's memory, so a new controller, or a clock that jumps, can
// only delay a replacement, never hasten it. A caller whose RemoveBroker
// is refused counts again from now.
func PlanReplacements(st *State, since map[string]time.Time, now time.Time, after time.Duration) (due []string, next time.Time) {
	for id := range since {
		if b := st.Brokers[id]; b == nil || b.Alive || b.Removed {
			delete(since, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(st.Brokers)) {
		b := st.Brokers[id]
		if b.Alive || b.Removed {
			continue
		}
		t, ok := since[id]
		if !ok {
			t = now
			since[id] = now
		}
		if at := t.Add(after); now.Before(at) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		due = append(due, id)
	}
	return due, next
}
