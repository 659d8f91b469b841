package sitetest

import (
	"strings"
	"testing"
	"time"
)

// The checks the site tests end with catch what they are there for: a
// replica that diverges or lacks records, an acknowledged message that is
// missing, a first-attempt message stored twice; and let a retried one be
// stored twice (at least once). Runs in make test (no processes).
func TestJudge(t *testing.T) {
	good := replica{"p0-1", "p1-1", "p0-2", "p0-2", "p1-2"}
	msgs := map[string]msgState{
		"p0-1": {attempts: 1, acked: true, first: true},
		"p1-1": {attempts: 1, acked: true, first: true},
		"p0-2": {attempts: 2, acked: true}, // retried: stored twice is allowed
		"p1-2": {attempts: 3},              // never acknowledged: stored anyway
		"p1-3": {attempts: 1},              // never acknowledged, not stored
	}
	for _, tc := range []struct {
		name     string
		replicas []replica
		msgs     map[string]msgState
		want     string // "" for no problem
	}{
		{"identical and complete", []replica{good, good, good}, msgs, ""},
		{"divergent offset", []replica{good, {"p0-1", "p1-1", "p0-2", "x", "p1-2"}, good}, msgs, "offset 3"},
		{"short replica", []replica{good, good[:4], good}, msgs, "holds 4 records"},
		{"acknowledged and lost", []replica{good, good}, with(msgs, "p9-1", msgState{attempts: 1, acked: true, first: true}), "p9-1 was acknowledged"},
		{"first attempt stored twice", []replica{append(good, "p0-1"), append(good, "p0-1")}, msgs, "stored 2 times"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problems, dups := judge(tc.replicas, tc.msgs)
			got := strings.Join(problems, "; ")
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("problems %q, want %q", got, tc.want)
			}
			if tc.want == "" && dups != 1 {
				t.Fatalf("%d messages stored twice, want 1 (p0-2)", dups)
			}
		})
	}
}

func with(m map[string]msgState, k string, v msgState) map[string]msgState {
	out := map[string]msgState{k: v}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// A producer's stall is its longest time without an answer that ends
// after the fault began, counting from its last answer before it, and
// the time since its last answer at the round's end; a PUBACK that never
// came is no answer (the producer records none). Runs in make test.
func TestStalls(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	l := &load{ledger: newLedger()}
	l.ledger.mu.answers["steady"] = []answer{{at(9.9), true}, {at(10.2), true}, {at(10.5), true}, {at(11), true}}
	// Answered 0.5 s before the fault, then nothing until 15 s after it
	// (a refusal), then acknowledged.
	l.ledger.mu.answers["stuck"] = []answer{{at(9.5), true}, {at(25), false}, {at(25.1), true}}
	// Acknowledged during the fault, then silent until the round's end.
	l.ledger.mu.answers["late"] = []answer{{at(10.1), true}, {at(12), true}}
	got := l.stalls(at(10), at(14), false)
	want := map[string]time.Duration{"steady": 3 * time.Second, "stuck": 4500 * time.Millisecond, "late": 2 * time.Second}
	got2 := l.stalls(at(10), at(26), false)
	want2 := map[string]time.Duration{"steady": 15 * time.Second, "stuck": 15500 * time.Millisecond, "late": 14 * time.Second}
	// Counting acknowledgements only, the refusal at 25 s ends nothing.
	got3 := l.stalls(at(10), at(26), true)
	want3 := map[string]time.Duration{"steady": 15 * time.Second, "stuck": 15600 * time.Millisecond, "late": 14 * time.Second}
	for _, c := range []struct{ got, want map[string]time.Duration }{{got, want}, {got2, want2}, {got3, want3}} {
		for id, w := range c.want {
			if d := c.got[id]; d.Round(time.Millisecond) != w {
				t.Errorf("%s: stall %v, want %v", id, d, w)
			}
		}
	}
}
