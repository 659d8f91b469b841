package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// agg is how a column folds the repetitions into one figure.
type agg int

const (
	aggMedian agg = iota
	aggSum        // counts that must be zero (loss, duplicates, errors): any one shows
)

// column is one table column: one metric, or several shown as "a / b / c".
type column struct {
	head string
	keys []string
	agg  agg
}

func col(head string, keys ...string) column { return column{head: head, keys: keys} }
func total(head string, keys ...string) column {
	return column{head: head, keys: keys, agg: aggSum}
}

// ratio is a column holding the median of per-repetition ratios of a metric
// to the same metric of a baseline system (base), or to baseKey of other
// runs (against) when those are set.
type ratio struct {
	head, key, base string
	against         reps
	baseKey         string
}

func vs(head, key, base string) ratio { return ratio{head: head, key: key, base: base} }

// table writes a markdown table with one row per name (a system, or a
// variant of a workload) that has runs.
func table(w io.Writer, first string, groups map[string]reps, names []string, cols []column, ratios []ratio) {
	heads := []string{first, "runs"}
	for _, c := range cols {
		heads = append(heads, c.head)
	}
	for _, r := range ratios {
		heads = append(heads, r.head)
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(heads, " | "), strings.Repeat("---|", len(heads)))
	for _, name := range names {
		rs := groups[name]
		if rs == nil {
			continue
		}
		row := []string{name, fmt.Sprintf("%d/%d", rs.measured(), len(rs))}
		for _, c := range cols {
			row = append(row, cell(rs, c))
		}
		for _, r := range ratios {
			row = append(row, ratioCell(rs, groups, r))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
}

func cell(rs reps, c column) string {
	parts := make([]string, len(c.keys))
	for i, k := range c.keys {
		var v float64
		var ok bool
		if c.agg == aggSum {
			v, ok = rs.sum(k)
		} else {
			v, ok = rs.median(k)
		}
		parts[i] = "-"
		if ok {
			parts[i] = num(v)
		}
	}
	return strings.Join(parts, " / ")
}

func ratioCell(rs reps, groups map[string]reps, r ratio) string {
	base, baseKey := groups[r.base], r.key
	if r.against != nil {
		base, baseKey = r.against, r.baseKey
	}
	if base == nil {
		return "-"
	}
	v, ok := ratioMedian(rs, base, metric(r.key), metric(baseKey))
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// num formats a figure with the precision it deserves: thousands grouped
// for rates, three significant digits for small values.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case a >= 1000:
		return group(int64(math.Round(v)))
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
