package sitetest

import (
	"strings"
	"testing"
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
