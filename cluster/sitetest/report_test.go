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
	line, _ := json.Marshal(map[string]any{
		"label": what, "kills": len(gaps),
		"resume_median_ms": float64(med.Microseconds()) / 1000, "resume_max_ms": float64(mx.Microseconds()) / 1000, "resume_ms": ms,
	})
	f, err := os.OpenFile(*reportFlag, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
}
