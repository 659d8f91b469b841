package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// writePlot writes, into dir, one data file per panel (medians over the
// repetitions) and compare.gp, a gnuplot script that draws every panel that
// has data into out (a PNG). bench.sh runs gnuplot on it.
func writePlot(dir, out, title string, res *results, limit float64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var panels []string
	files := map[string]*strings.Builder{}
	file := func(name string) *strings.Builder {
		if files[name] == nil {
			files[name] = &strings.Builder{}
		}
		return files[name]
	}
	q := func(name string) string { return gpString(filepath.Join(dir, name)) }

	// W1: offered against delivered, and against the end-to-end p99.
	if sw := res.sweeps("W1"); len(sw) > 0 {
		var delivered, p99 []string
		for i, sys := range systemsIn(res, "W1") {
			name := "w1-" + sys + ".dat"
			b := file(name)
			fmt.Fprintln(b, "# offered_k delivered_k_per_s e2e_p99_ms")
			for _, rate := range allRates(sw) {
				rs := atRate(sw[sys], rate)
				if len(rs) == 0 {
					continue
				}
				d, _ := rs.median("delivered_per_s")
				p, _ := rs.median("e2e_p99_ms")
				fmt.Fprintf(b, "%g %g %g\n", rate/1000, d/1000, math.Max(p, 0.01))
			}
			delivered = append(delivered, fmt.Sprintf("%s using 1:2 with linespoints ls %d title %s", q(name), i+1, gpString(sys)))
			p99 = append(p99, fmt.Sprintf("%s using 1:3 with linespoints ls %d title %s", q(name), i+1, gpString(sys)))
		}
		panels = append(panels,
			"set title 'W1: QoS 0 fan-in, delivered vs offered'\nset xlabel 'offered, thousand msg/s'\nset ylabel 'delivered, thousand msg/s'\nset key top left\n"+
				"plot x with lines dt 2 lc 'gray' title 'offered', \\\n  "+strings.Join(delivered, ", \\\n  "),
			fmt.Sprintf("set title 'W1: end-to-end p99 (ms, log scale)'\nset xlabel 'offered, thousand msg/s'\nset ylabel 'p99 ms'\nset logscale y\nset key top left\n"+
				"plot %g with lines dt 2 lc 'red' title '%g ms', \\\n  %s\nunset logscale y", limit, limit, strings.Join(p99, ", \\\n  ")))
	}

	// W2: delivered/s and PUBACK p99 for both windows.
	if res.hasTag("W2/16") || res.hasTag("W2/1") {
		b := file("w2.dat")
		fmt.Fprintln(b, "# system delivered_w16 delivered_w1 puback_p99_w16 puback_p99_w1")
		w16, w1 := res.bySystem("W2/16"), res.bySystem("W2/1")
		for _, sys := range res.systems {
			if w16[sys] == nil && w1[sys] == nil {
				continue
			}
			fmt.Fprintf(b, "%s %s %s %s %s\n", sys, med(w16[sys], "delivered_per_s"), med(w1[sys], "delivered_per_s"),
				med(w16[sys], "puback_p99_ms"), med(w1[sys], "puback_p99_ms"))
		}
		// Only the windows that measured something: gnuplot refuses a
		// histogram column without a valid point, and the chart with it.
		var delivered, p99 []string
		for _, w := range []struct {
			g          map[string]reps
			dcol, pcol int
			name       string
		}{{w16, 2, 4, "window 16"}, {w1, 3, 5, "window 1"}} {
			if anyMeasured(w.g, "delivered_per_s") {
				delivered = append(delivered, fmt.Sprintf("%s using %d:xtic(1) title '%s'", q("w2.dat"), w.dcol, w.name))
			}
			if anyMeasured(w.g, "puback_p99_ms") {
				p99 = append(p99, fmt.Sprintf("%s using %d:xtic(1) title '%s'", q("w2.dat"), w.pcol, w.name))
			}
		}
		if len(delivered) > 0 {
			panels = append(panels, fmt.Sprintf("set title 'W2: QoS 1 fan-in, delivered msg/s'\nset ylabel 'msg/s'\nset key top right\n%s\n"+
				"plot %s", histogram, strings.Join(delivered, ", ")))
		}
		if len(p99) > 0 {
			panels = append(panels, fmt.Sprintf("set title 'W2: PUBACK p99 (ms)'\nset ylabel 'ms'\nset key top right\n%s\n"+
				"plot %s", histogram, strings.Join(p99, ", ")))
		}
	}

	// W3: durable ingest acks/s, with one fsync at a time as a line.
	if anyMeasured(res.bySystem("W3"), "acked_per_s") {
		b := file("w3.dat")
		fmt.Fprintln(b, "# system acked_per_s")
		g := res.bySystem("W3")
		for _, sys := range systemsIn(res, "W3") {
			fmt.Fprintf(b, "%s %s\n", sys, med(g[sys], "acked_per_s"))
		}
		line := ""
		if per, ok := res.byRep("fsync").median("per_s_at_p50"); ok {
			line = fmt.Sprintf(", %g with lines dt 2 lc 'red' title '1 / fsync p50'", per)
		}
		panels = append(panels, fmt.Sprintf("set title 'W3: QoS 1 acks/s, no subscriber'\nset ylabel 'acks/s'\nset key top right\n%s\n"+
			"plot %s using 2:xtic(1) title 'acked/s'%s", histogram, q("w3.dat"), line))
	}

	// W4: replay rates against the targets.
	replays := map[string]reps{"qos0": res.byRep("W4/qos0"), "qos1": res.byRep("W4/qos1"), "load": res.byRep("W4/load")}
	if anyMeasured(replays, "msg_per_s") {
		b := file("w4.dat")
		fmt.Fprintln(b, "# consumer msg_per_s target")
		top := 0.0
		for _, v := range []struct {
			tag, name string
			target    int
		}{{"W4/qos0", "QoS0", targetReplayQoS0}, {"W4/qos1", "QoS1", targetReplayQoS1}, {"W4/load", "QoS0+fan-in", targetReplayQoS0}} {
			if rs := res.byRep(v.tag); len(rs) > 0 {
				fmt.Fprintf(b, "%s %s %d\n", v.name, med(rs, "msg_per_s"), v.target)
				top = max(top, float64(v.target))
				if m, ok := rs.median("msg_per_s"); ok {
					top = max(top, m)
				}
			}
		}
		// Room above the highest bar or target, so the target marks show.
		panels = append(panels, fmt.Sprintf("set title 'W4: Peat replay from offset 0, msg/s'\nset ylabel 'msg/s'\nset key top left\n%s\nset yrange [0:%g]\n"+
			"plot %s using 2:xtic(1) title 'replayed', '' using 3 title 'target' fs empty border lc 'red' lw 2", histogram, top*1.2, q("w4.dat")))
	}

	// W5: the site's acks/s beside one fsync node's, and the failover times.
	if anyMeasured(res.bySystem("W5"), "acked_per_s") {
		panels = append(panels, w5Panel(res, "W5", "3 nodes sharing one core", file("w5.dat"), q("w5.dat")))
	}
	if anyMeasured(res.bySystem("W5/capped"), "acked_per_s") {
		panels = append(panels, w5Panel(res, "W5/capped", "each node an equal share of one core", file("w5-capped.dat"), q("w5-capped.dat")))
	}
	if anyMeasured(res.bySystem("W5/failover"), "resume_median_ms") {
		panels = append(panels, w5FailoverPanel(res, file("w5-failover.dat"), q("w5-failover.dat")))
	}

	// W6: CPU per message and RSS under load.
	if res.hasTag("W6") {
		b := file("w6.dat")
		fmt.Fprintln(b, "# system cpu_us_per_msg rss_max_mb")
		g := res.bySystem("W6")
		for _, sys := range systemsIn(res, "W6") {
			fmt.Fprintf(b, "%s %s %s\n", sys, med(g[sys], "cpu_us_per_msg"), med(g[sys], "rss_max_mb"))
		}
		if anyMeasured(g, "cpu_us_per_msg") {
			panels = append(panels, fmt.Sprintf("set title 'W6: 1 msg/s sensors, broker CPU µs per message'\nset ylabel 'µs'\nunset key\n%s\n"+
				"plot %s using 2:xtic(1)", histogram, q("w6.dat")))
		}
		if anyMeasured(g, "rss_max_mb") {
			panels = append(panels, fmt.Sprintf("set title 'W6: broker RSS under load (MB)'\nset ylabel 'MB'\nunset key\n%s\n"+
				"plot %s using 3:xtic(1)", histogram, q("w6.dat")))
		}
	}

	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	rows := (len(panels) + 1) / 2
	var gp strings.Builder
	fmt.Fprintf(&gp, "# Written by scripts/benchtable; run: gnuplot %s\n", filepath.Join(dir, "compare.gp"))
	fmt.Fprintf(&gp, "set terminal pngcairo size 1400,%d font 'sans,10'\nset output %s\n", 60+440*max(rows, 1), gpString(out))
	fmt.Fprintf(&gp, "set multiplot layout %d,2 title %s\n", max(rows, 1), gpString(title))
	for _, p := range panels {
		fmt.Fprintf(&gp, "\nreset\n%s\n%s\n", panelSetup, p)
	}
	fmt.Fprintln(&gp, "\nunset multiplot")
	return os.WriteFile(filepath.Join(dir, "compare.gp"), []byte(gp.String()), 0o644)
}

// The targets for W5, a three-node site against one fsync node.
const (
	targetSiteRatio  = 0.5  // a site's acks/s against one fsync node's
	targetFailoverMS = 5000 // from a leader's kill -9 until acks resume
)

// w5Panel draws the acks/s of each system of a W5 tag (medians over the
// repetitions), a site's bar labelled with its ratio to peat-fsync taken
// within each repetition, as the table does, and the target as a line.
func w5Panel(res *results, tag, how string, b *strings.Builder, data string) string {
	g := res.bySystem(tag)
	fmt.Fprintln(b, "# system acked_per_s ratio_label")
	top := 0.0
	for _, sys := range systemsIn(res, tag) {
		label := ""
		if r, ok := ratioMedian(g[sys], g[basePeatFsync], metric("acked_per_s"), metric("acked_per_s")); ok && sys != basePeatFsync {
			label = fmt.Sprintf("%.2fx %s", r, basePeatFsync)
		}
		if v, ok := g[sys].median("acked_per_s"); ok {
			top = max(top, v)
		}
		fmt.Fprintf(b, "%s %s %s\n", sys, med(g[sys], "acked_per_s"), gpDataString(label))
	}
	line := ""
	if v, ok := g[basePeatFsync].median("acked_per_s"); ok {
		line = fmt.Sprintf(", %g with lines dt 2 lc 'red' title 'target: %gx %s'", v*targetSiteRatio, targetSiteRatio, basePeatFsync)
	}
	// Room above the highest bar for its label.
	return fmt.Sprintf("set title 'W5: QoS 1 acks/s, 3 nodes with acks=all vs 1 with fsync, %s'\nset ylabel 'acks/s'\nset key top right\n%s\nset yrange [0:%g]\n"+
		"plot %s using 2:xtic(1) title 'acked/s', '' using 0:2:3 with labels offset 0,1 notitle%s", how, histogram, max(top, 1)*1.25, data, line)
}

// anyMeasured says whether a run of any system measured k: a histogram
// column with no valid point makes gnuplot give up on the whole chart.
func anyMeasured(g map[string]reps, k string) bool {
	for _, rs := range g {
		if _, ok := rs.median(k); ok {
			return true
		}
	}
	return false
}

// w5FailoverPanel draws, per system, the median time from a leader's
// kill -9 until acknowledgements resume and the worst kill, against the
// target. bench.sh times the kills in one repetition; were there more, the
// bars are the median of their medians and the highest maximum.
func w5FailoverPanel(res *results, b *strings.Builder, data string) string {
	g := res.bySystem("W5/failover")
	fmt.Fprintln(b, "# system resume_median_ms resume_max_ms")
	top, kills := float64(targetFailoverMS), 0.0
	for _, sys := range systemsIn(res, "W5/failover") {
		worst := "NaN"
		if v, ok := g[sys].highest("resume_max_ms"); ok {
			worst, top = fmt.Sprintf("%g", v), max(top, v)
		}
		k, _ := g[sys].sum("kills")
		kills += k
		fmt.Fprintf(b, "%s %s %s\n", sys, med(g[sys], "resume_median_ms"), worst)
	}
	return fmt.Sprintf("set title 'W5: leader kill -9 until acks resume, ms (%g kills)'\nset ylabel 'ms'\nset key top right\n%s\nset yrange [0:%g]\n"+
		"plot %s using 2:xtic(1) title 'median', '' using 3 title 'max', %d with lines dt 2 lc 'red' title 'target %d ms', \\\n  "+
		// Each value above its bar: a cluster of two bars with gap 1 puts
		// them a sixth of a unit either side of the row's x.
		"'' using ($0-1/6.):2:(sprintf('%%.0f', $2)) with labels offset 0,0.8 notitle, '' using ($0+1/6.):3:(sprintf('%%.0f', $3)) with labels offset 0,0.8 notitle",
		kills, histogram, top*1.25, data, targetFailoverMS, targetFailoverMS)
}

// panelSetup starts every panel: a grid, compact numbers, and one colour
// and point shape per system, in the order the systems ran.
const panelSetup = "set grid ytics\nset format y '%g'\nset format x '%g'\n" +
	"set style line 1 lc rgb '#1b9e77' lw 2 pt 7\nset style line 2 lc rgb '#d95f02' lw 2 pt 5\n" +
	"set style line 3 lc rgb '#7570b3' lw 2 pt 9\nset style line 4 lc rgb '#e7298a' lw 2 pt 11\n" +
	"set style line 5 lc rgb '#66a61e' lw 2 pt 13\nset style line 6 lc rgb '#e6ab02' lw 2 pt 3"

// histogram sets up gnuplot's clustered bars.
const histogram = "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\nset xtics rotate by -20\nset yrange [0:*]"

// med is a median for a data file; NaN (no bar) when nothing measured it.
func med(rs reps, k string) string {
	if v, ok := rs.median(k); ok {
		return fmt.Sprintf("%g", v)
	}
	return "NaN"
}

// gpString quotes s as a gnuplot single-quoted string.
func gpString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// highest value of metric k over the repetitions that measured it.
func (rs reps) highest(k string) (float64, bool) {
	v, ok := 0.0, false
	for _, r := range rs {
		if !r.failed() && r.has(k) && (!ok || r.num(k) > v) {
			v, ok = r.num(k), true
		}
	}
	return v, ok
}

// gpDataString quotes s as a string field of a gnuplot data file.
func gpDataString(s string) string { return `"` + strings.ReplaceAll(s, `"`, "'") + `"` }
