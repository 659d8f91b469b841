// Command benchtable turns the lines of a benchmark script ("<rep> <json>")
// into markdown tables: per workload (QoS), the median of each metric per
// system, and the median over repetitions of each system's ratio to the
// baseline system measured in the same repetition.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
)

type run map[string]any

func (r run) num(k string) float64 { f, _ := r[k].(float64); return f }
func (r run) str(k string) string  { s, _ := r[k].(string); return s }

func main() {
	baseline := "mochi"
	if len(os.Args) > 1 {
		baseline = os.Args[1]
	}
	// workload -> system -> rep -> run
	data := map[string]map[string]map[string]run{}
	var systems []string
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		rep, js, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var r run
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			fmt.Fprintln(os.Stderr, "benchtable: skipping line:", err)
			continue
		}
		w := fmt.Sprintf("%s QoS %v, %v publishers, window %v, %v B, offered %v msg/s (0 = unthrottled)",
			r.str("workload"), r["qos"], r["publishers"], r["window"], r["payload"], r["rate"])
		sys := r.str("label")
		if !slices.Contains(systems, sys) {
			systems = append(systems, sys)
		}
		if data[w] == nil {
			data[w] = map[string]map[string]run{}
		}
		if data[w][sys] == nil {
			data[w][sys] = map[string]run{}
		}
		data[w][sys][rep] = r
	}
	metrics := []string{"delivered_per_s", "lost", "dups", "puback_p50_ms", "puback_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "cpu_us_per_msg", "rss_peak_mb"}
	workloads := make([]string, 0, len(data))
	for w := range data {
		workloads = append(workloads, w)
	}
	slices.Sort(workloads)
	for _, w := range workloads {
		fmt.Printf("\n### %s\n\n| system | %s | delivered/s vs %s | CPU/msg vs %s |\n|---|%s---|---|\n",
			w, strings.Join(metrics, " | "), baseline, baseline, strings.Repeat("---|", len(metrics)))
		for _, sys := range systems {
			reps := data[w][sys]
			if reps == nil {
				continue
			}
			row := []string{sys}
			for _, m := range metrics {
				row = append(row, fmt.Sprintf("%.2f", median(reps, func(r run) float64 { return r.num(m) })))
			}
			for _, m := range []string{"delivered_per_s", "cpu_us_per_msg"} {
				var ratios []float64
				for rep, r := range reps {
					if b, ok := data[w][baseline][rep]; ok && b.num(m) > 0 {
						ratios = append(ratios, r.num(m)/b.num(m))
					}
				}
				row = append(row, fmt.Sprintf("%.2f", medianOf(ratios)))
			}
			fmt.Printf("| %s |\n", strings.Join(row, " | "))
		}
	}
}

func median(reps map[string]run, f func(run) float64) float64 {
	var v []float64
	for _, r := range reps {
		v = append(v, f(r))
	}
	return medianOf(v)
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
