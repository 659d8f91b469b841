package sitetest

import (
	"encoding/json"
	"flag"
	"os"
	"slices"
	"testing"
	"time"
)

var reportFlag = flag.String("sitetest.report", "", "appends a JSON line with the failover times of the leader kills to this file (scripts/bench.sh W5)")

// report logs the median and max of gaps (kill to the first
// acknowledgement of a message sent after it) and, with -sitetest.report,
// appends them as a JSON line.
func report(t *testing.T, what string, gaps []time.Duration) {
	if len(gaps) == 0 {
		return
	}
	sorted := slices.Clone(gaps)
	slices.Sort(sorted)
	med, mx := sorted[len(sorted)/2], sorted[len(sorted)-1]
	if len(sorted)%2 == 0 {
		med = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	t.Logf("%s: %d kills, acknowledgements resumed after median %v, max %v", what, len(gaps), med.Round(time.Millisecond), mx.Round(time.Millisecond))
	if *reportFlag == "" {
		return
	}
	ms := make([]float64, len(gaps))
	for i, g := range gaps {
		ms[i] = float64(g.Microseconds()) / 1000
	}
	appendReport(t, map[string]any{
		"label": what, "kills": len(gaps),
		"resume_median_ms": float64(med.Microseconds()) / 1000, "resume_max_ms": float64(mx.Microseconds()) / 1000, "resume_ms": ms,
	})
}

// appendReport appends v as a JSON line to -sitetest.report.
func appendReport(t *testing.T, v any) {
	line, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(*reportFlag, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
}

// partitionReport logs a partition test's rounds and a summary (the
// longest of each column over the rounds) as rows of the tables in
// scripts/bench-results/partition.md and, with -sitetest.report, appends
// them as a JSON line.
func partitionReport(t *testing.T, kind string, rounds []roundResult, acks int, res checked) {
	ms := func(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }
	var worst roundResult
	var rows []map[string]any
	for i, r := range rounds {
		t.Logf("partition row: | %s | %d | %s | %.1f s | %.1f s | %.1f s | %.1f s | %.1f s | %.1f s | %d |", kind, i+1, r.what,
			ms(r.majority), ms(r.cut), ms(r.majorityAck), ms(r.cutAck), ms(r.isr), ms(r.acked), r.acks)
		worst.majority, worst.cut = max(worst.majority, r.majority), max(worst.cut, r.cut)
		worst.majorityAck, worst.cutAck = max(worst.majorityAck, r.majorityAck), max(worst.cutAck, r.cutAck)
		worst.isr, worst.acked = max(worst.isr, r.isr), max(worst.acked, r.acked)
		rows = append(rows, map[string]any{"what": r.what, "majority_stall_s": ms(r.majority), "cut_stall_s": ms(r.cut),
			"majority_no_ack_s": ms(r.majorityAck), "cut_no_ack_s": ms(r.cutAck),
			"isr_after_heal_s": ms(r.isr), "acked_after_heal_s": ms(r.acked), "acks": r.acks})
	}
	t.Logf("partition summary: | %s | %d | %d | %d | %d | %.1f s | %.1f s | %.1f s | %.1f s | %.1f s | %.1f s |", kind, len(rounds), acks,
		res.lost, res.divergent, ms(worst.majority), ms(worst.cut), ms(worst.majorityAck), ms(worst.cutAck), ms(worst.isr), ms(worst.acked))
	if *reportFlag == "" {
		return
	}
	appendReport(t, map[string]any{"label": "partition-" + kind, "rounds": rows, "acknowledged": acks,
		"lost": res.lost, "divergent": res.divergent})
}
