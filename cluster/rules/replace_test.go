package rules

import (
	"slices"
	"testing"
	"time"
)

// A broker failed for replace_after is due for removal, counted from when
// the caller first saw it failed; one back alive, or removed, is
// forgotten.
func TestPlanReplacements(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	ft.ok(BrokerFailed{ID: "b", Epoch: 1})
	st, _ := ft.f.State()
	t0 := time.Unix(1000, 0)
	after := time.Minute
	since := map[string]time.Time{}
	if due, next := PlanReplacements(st, since, t0, after); due != nil || !next.Equal(t0.Add(after)) {
		t.Fatalf("first look: due %v, next %v", due, next)
	}
	if due, _ := PlanReplacements(st, since, t0.Add(after-time.Second), after); due != nil {
		t.Fatalf("due early: %v", due)
	}
	ft.ok(BrokerFailed{ID: "c", Epoch: 1})
	st, _ = ft.f.State()
	due, next := PlanReplacements(st, since, t0.Add(after), after)
	if !slices.Equal(due, []string{"b"}) || !next.Equal(t0.Add(2*after)) {
		t.Fatalf("due %v, next %v; want b, and c a minute later", due, next)
	}
	ft.ok(RegisterBroker{ID: "c", Epoch: 2}) // back: its count ends
	st, _ = ft.f.State()
	if due, next := PlanReplacements(st, since, t0.Add(3*after), after); !slices.Equal(due, []string{"b"}) || !next.IsZero() {
		t.Fatalf("due %v, next %v", due, next)
	}
	if _, ok := since["c"]; ok {
		t.Fatal("c, alive again, still counted")
	}
}
