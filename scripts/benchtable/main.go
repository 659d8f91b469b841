// Command benchtable turns the result lines of the benchmark scripts into
// markdown tables of medians and of medians of per-repetition ratios.
//
//	benchtable [baseline] < lines          "<rep> <json>" of bench-fanin.sh: a table per fan-in workload
//	benchtable compare [flags] < lines     "<tag> <rep> <json>" of bench.sh: a section per workload W1-W6,
//	                                       and with --plot DIR the data and gnuplot script of a chart
//	benchtable knee [flags] SYSTEM < lines the median W1 knee of SYSTEM (exit 1 if it has none)
//	benchtable carried [flags] < json      exit 0 if one W1 run carried its offered rate, 1 if not
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

type run map[string]any

func (r run) num(k string) float64 { f, _ := r[k].(float64); return f }
func (r run) str(k string) string  { s, _ := r[k].(string); return s }

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "compare", "knee", "carried":
			code, err := command(os.Args[1], os.Args[2:], os.Stdin, os.Stdout)
			if err != nil {
				fmt.Fprintln(os.Stderr, "benchtable:", err)
			}
			os.Exit(code)
		}
	}
	fanin()
}

// command runs one of bench.sh's subcommands; the int is the exit status.
func command(name string, args []string, in io.Reader, out io.Writer) (int, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	limit := fs.Float64("p99", DefaultP99Limit, "W1: end-to-end p99 bound in ms for a rate to count as carried")
	plotDir := fs.String("plot", "", "compare: write the chart's data files and compare.gp here")
	png := fs.String("png", "compare.png", "compare: the PNG compare.gp draws")
	title := fs.String("title", "Peat beside Mosquitto and mochi", "compare: the chart's title")
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	if name == "carried" {
		var r run
		if err := json.NewDecoder(in).Decode(&r); err != nil {
			return 2, fmt.Errorf("carried: read a peat-bench JSON line: %w", err)
		}
		if carried(r, *limit) {
			return 0, nil
		}
		return 1, nil
	}
	res, err := parseResults(in)
	if err != nil {
		return 2, err
	}
	switch name {
	case "knee":
		if fs.NArg() != 1 {
			return 2, fmt.Errorf("knee: want one system name, got %q", fs.Args())
		}
		k, ok := kneeOf(res, fs.Arg(0), *limit)
		if !ok {
			return 1, nil
		}
		fmt.Fprintf(out, "%.0f\n", k)
		return 0, nil
	default:
		compare(out, res, *limit)
		if *plotDir != "" {
			if err := writePlot(*plotDir, *png, *title, res, *limit); err != nil {
				return 1, fmt.Errorf("compare: write the chart's files: %w", err)
			}
		}
		return 0, nil
	}
}

// fanin is the table of bench-fanin.sh: lines "<rep> <json>", the
// baseline system named by the only argument (default mochi).
func fanin() {
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
