package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// point is one line that scripts/bench.sh records: "<tag> <rep> <json>",
// where tag names the workload (W1, W2/16, W3, fsync, W4/qos0, W6, ...),
// rep the repetition, and json is what peat-bench printed for the run.
type point struct {
	tag string
	rep int
	r   run
}

// results is a whole bench.sh run.
type results struct {
	points  []point
	systems []string // labels in the order they first appear
}

func (r run) has(k string) bool { _, ok := r[k]; return ok }

// failed says whether the run produced no measurement (bench.sh records
// {"label": ..., "error": ...} when peat-bench or the broker failed).
func (r run) failed() bool { return r.str("error") != "" }

// parseResults reads bench.sh's lines. Blank lines and lines starting with
// '#' are skipped; anything else that does not parse is an error naming
// the line, since a table silently missing runs would mislead.
func parseResults(rd io.Reader) (*results, error) {
	res := &results{}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || text[0] == '#' {
			continue
		}
		tag, rest, ok1 := strings.Cut(text, " ")
		repText, js, ok2 := strings.Cut(rest, " ")
		rep, err := strconv.Atoi(repText)
		if !ok1 || !ok2 || err != nil {
			return nil, fmt.Errorf("line %d: want \"<tag> <rep> <json>\", got %.60q", n, text)
		}
		var r run
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			return nil, fmt.Errorf("line %d (%s rep %d): %w", n, tag, rep, err)
		}
		res.points = append(res.points, point{tag: tag, rep: rep, r: r})
		if sys := r.str("label"); sys != "" && tag != "fsync" && !slices.Contains(res.systems, sys) {
			res.systems = append(res.systems, sys)
		}
	}
	return res, sc.Err()
}

// reps maps a repetition to its run.
type reps map[int]run

// bySystem groups the runs of one tag: system -> rep -> run.
func (res *results) bySystem(tag string) map[string]reps {
	out := map[string]reps{}
	for _, p := range res.points {
		if p.tag != tag {
			continue
		}
		sys := p.r.str("label")
		if out[sys] == nil {
			out[sys] = reps{}
		}
		out[sys][p.rep] = p.r
	}
	return out
}

// byRep gives the runs of one tag whatever their label: rep -> run.
func (res *results) byRep(tag string) reps {
	out := reps{}
	for _, p := range res.points {
		if p.tag == tag {
			out[p.rep] = p.r
		}
	}
	return out
}

func (res *results) hasTag(tag string) bool {
	return slices.ContainsFunc(res.points, func(p point) bool { return p.tag == tag })
}

// sortedReps lists the repetitions in order, so that output never depends
// on map iteration.
func (rs reps) sorted() []int {
	keys := make([]int, 0, len(rs))
	for k := range rs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// measured counts the repetitions that produced a measurement.
func (rs reps) measured() int {
	n := 0
	for _, r := range rs {
		if !r.failed() {
			n++
		}
	}
	return n
}

// median of metric k over the repetitions that measured it.
func (rs reps) median(k string) (float64, bool) {
	var v []float64
	for _, rep := range rs.sorted() {
		if r := rs[rep]; !r.failed() && r.has(k) {
			v = append(v, r.num(k))
		}
	}
	return medianOf(v), len(v) > 0
}

// sum of metric k over the repetitions that measured it.
func (rs reps) sum(k string) (float64, bool) {
	var s float64
	ok := false
	for _, r := range rs {
		if !r.failed() && r.has(k) {
			s += r.num(k)
			ok = true
		}
	}
	return s, ok
}

// ratioMedian is the median, over the repetitions both measured, of
// num(rs)/num(base) taken within each repetition. Machines drift between
// repetitions; a ratio within one repetition cancels most of the drift, which
// a ratio of medians does not.
func ratioMedian(rs, base reps, num, den func(run) (float64, bool)) (float64, bool) {
	var v []float64
	for _, rep := range rs.sorted() {
		b, ok := base[rep]
		if !ok || rs[rep].failed() || b.failed() {
			continue
		}
		n, ok1 := num(rs[rep])
		d, ok2 := den(b)
		if ok1 && ok2 && d > 0 {
			v = append(v, n/d)
		}
	}
	return medianOf(v), len(v) > 0
}

// metric reads k from a run, if it has it.
func metric(k string) func(run) (float64, bool) {
	return func(r run) (float64, bool) { return r.num(k), r.has(k) }
}
