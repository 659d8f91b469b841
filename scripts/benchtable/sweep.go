package main

import (
	"slices"
)

// DefaultP99Limit is W1's latency bound: a rate counts as carried only if
// the end-to-end p99 stays below it (milliseconds).
const DefaultP99Limit = 10.0

// carried says whether one W1 run carried its offered rate: it measured
// something, every message arrived exactly once (no loss, no duplicate),
// and the end-to-end p99, counted from each message's intended send time,
// stayed below limit milliseconds. A load generator that could not keep up
// fails here too, because its lag shows in the end-to-end latency.
func carried(r run, limit float64) bool {
	return !r.failed() && r.has("lost") && r.has("e2e_p99_ms") && r.num("received") > 0 &&
		r.num("lost") == 0 && r.num("dups") == 0 && r.num("e2e_p99_ms") < limit
}

// sweep is one system's W1 runs in one repetition: offered rate -> run.
type sweep map[float64]run

func (s sweep) rates() []float64 {
	rs := make([]float64, 0, len(s))
	for r := range s {
		rs = append(rs, r)
	}
	slices.Sort(rs)
	return rs
}

// knee is the highest offered rate that was carried with every lower rate
// of the sweep carried too; 0 when the lowest already failed. Stopping at
// the first failure keeps a lucky pass above a failed rate (noise on a
// shared machine) from raising the knee.
func (s sweep) knee(limit float64) float64 {
	k := 0.0
	for _, rate := range s.rates() {
		if !carried(s[rate], limit) {
			break
		}
		k = rate
	}
	return k
}

// sweeps groups the runs of tag (W1) by system and repetition.
func (res *results) sweeps(tag string) map[string]map[int]sweep {
	out := map[string]map[int]sweep{}
	for _, p := range res.points {
		if p.tag != tag {
			continue
		}
		sys := p.r.str("label")
		if out[sys] == nil {
			out[sys] = map[int]sweep{}
		}
		if out[sys][p.rep] == nil {
			out[sys][p.rep] = sweep{}
		}
		out[sys][p.rep][p.r.num("rate")] = p.r
	}
	return out
}

// knees gives each repetition's knee of one system, as runs holding a
// "knee" metric so the ratio helpers apply, and "found" only when the
// sweep carried at least its lowest rate: a knee below the sweep is not a
// number to divide by or into.
func knees(bySweep map[int]sweep, limit float64) reps {
	out := reps{}
	for rep, s := range bySweep {
		k := s.knee(limit)
		out[rep] = run{"knee": k}
		if k > 0 {
			out[rep]["found"] = k
		}
	}
	return out
}

// atRate picks one offered rate out of a system's sweeps: rep -> run.
func atRate(bySweep map[int]sweep, rate float64) reps {
	out := reps{}
	for rep, s := range bySweep {
		if r, ok := s[rate]; ok {
			out[rep] = r
		}
	}
	return out
}

// allRates lists every offered rate any system was run at.
func allRates(sw map[string]map[int]sweep) []float64 {
	var rs []float64
	for _, bySweep := range sw {
		for _, s := range bySweep {
			for r := range s {
				if !slices.Contains(rs, r) {
					rs = append(rs, r)
				}
			}
		}
	}
	slices.Sort(rs)
	return rs
}
