package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// w1 is one canned W1 run: offered rate, delivered/s, lost and p99.
func w1(t testing.TB, rep int, sys string, rate, delivered, lost, p99, cpu float64) string {
	t.Helper()
	return line(t, "W1", rep, map[string]any{"label": sys, "workload": "fanin", "qos": 0, "payload": 128, "rate": rate,
		"received": rate * 2, "delivered_per_s": delivered, "offered_per_s": rate, "lost": lost, "dups": 0,
		"e2e_p50_ms": p99 / 4, "e2e_p99_ms": p99, "e2e_p999_ms": p99 * 2, "cpu_us_per_msg": cpu, "rss_idle_mb": 8, "rss_peak_mb": 12})
}

func line(t testing.TB, tag string, rep int, m map[string]any) string {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return tag + " " + string(rune('0'+rep)) + " " + string(b) + "\n"
}

func parse(t testing.TB, text string) *results {
	t.Helper()
	res, err := parseResults(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestSweep_Knee(t *testing.T) {
	pass := func(rate float64) run {
		return run{"rate": rate, "received": 10.0, "lost": 0.0, "dups": 0.0, "e2e_p99_ms": 3.0}
	}
	with := func(r run, k string, v any) run { r[k] = v; return r }
	for _, tc := range []struct {
		name string
		s    sweep
		want float64
	}{
		{"every rate carried", sweep{10: pass(10), 20: pass(20), 40: pass(40)}, 40},
		{"p99 at the limit fails", sweep{10: pass(10), 20: pass(20), 40: with(pass(40), "e2e_p99_ms", 10.0)}, 20},
		{"one lost message fails", sweep{10: pass(10), 20: with(pass(20), "lost", 1.0), 40: pass(40)}, 10},
		{"a duplicate fails", sweep{10: pass(10), 20: with(pass(20), "dups", 1.0)}, 10},
		{"a lucky pass above a failure does not count", sweep{10: pass(10), 20: with(pass(20), "e2e_p99_ms", 50.0), 40: pass(40)}, 10},
		{"a failed run fails", sweep{10: pass(10), 20: run{"label": "x", "error": "peat-bench fanin exited 1"}}, 10},
		{"nothing delivered fails", sweep{10: with(pass(10), "received", 0.0)}, 0},
		{"the lowest rate fails", sweep{10: with(pass(10), "lost", 5.0), 20: pass(20)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.knee(DefaultP99Limit); got != tc.want {
				t.Errorf("knee %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRatioMedian_IsTakenWithinEachRepetition(t *testing.T) {
	peat := reps{1: {"x": 100.0}, 2: {"x": 300.0}, 3: {"x": 200.0}, 4: {"x": 999.0}}
	mochi := reps{1: {"x": 100.0}, 2: {"x": 100.0}, 3: {"x": 400.0}, 5: {"x": 1.0}}
	// Per repetition 1, 3, 0.5 (reps 4 and 5 have no partner): median 1. The
	// ratio of the medians would be 200/100 = 2.
	got, ok := ratioMedian(peat, mochi, metric("x"), metric("x"))
	if !ok || got != 1 {
		t.Fatalf("ratio median %v (ok %v), want 1 from the per-repetition ratios 1, 3, 0.5", got, ok)
	}
	mochi[2] = run{"label": "mochi", "error": "failed"}
	if got, _ := ratioMedian(peat, mochi, metric("x"), metric("x")); got != 0.75 {
		t.Errorf("with mochi's repetition 2 failed: %v, want 0.75 (median of 1 and 0.5)", got)
	}
}

// cannedRun is a bench.sh run of two repetitions with W1, W2, W3 and W6.
func cannedRun(t testing.TB) string {
	var b strings.Builder
	for rep := 1; rep <= 2; rep++ {
		// mosquitto carries 10k and 20k; mochi everything; peat-interval 40k
		// in repetition 1 and 20k in repetition 2.
		for _, rate := range []float64{10000, 20000, 40000} {
			mosqP99, mosqLost := 2.0, 0.0
			if rate == 40000 {
				mosqP99, mosqLost = 900, 1000
			}
			b.WriteString(w1(t, rep, "mosquitto", rate, rate, mosqLost, mosqP99, 20))
			b.WriteString(w1(t, rep, "mochi", rate, rate, 0, 1, 10*float64(rep)))
			peatP99 := 4.0
			if rep == 2 && rate == 40000 {
				peatP99 = 25
			}
			b.WriteString(w1(t, rep, "peat-interval", rate, rate, 0, peatP99, 15*float64(rep)))
		}
		for _, s := range []struct {
			sys  string
			rate float64
			lost float64
		}{{"mosquitto", 5000, 40000}, {"mochi", 40000, 0}, {"peat-interval", 30000 * float64(rep), 0}} {
			b.WriteString(line(t, "W2/16", rep, map[string]any{"label": s.sys, "payload": 128, "delivered_per_s": s.rate,
				"lost": s.lost, "dups": 0, "puback_p50_ms": 1, "puback_p99_ms": 5, "puback_p999_ms": 9, "cpu_us_per_msg": 20}))
		}
		b.WriteString(line(t, "fsync", rep, map[string]any{"label": "disk", "dir": "/data", "block": 256,
			"fsync_p50_ms": 0.5, "fsync_p99_ms": 4, "fsync_p999_ms": 9, "per_s_at_p50": 2000}))
		b.WriteString(line(t, "W3", rep, map[string]any{"label": "peat-fsync", "payload": 128, "acked_per_s": 30000}))
		b.WriteString(line(t, "W6", rep, map[string]any{"label": "peat-interval", "connections": 1000, "rate": 1, "payload": 32,
			"acked": 10000, "errors": 0, "cpu_us_per_msg": 300, "rss_max_mb": 100}))
		b.WriteString(line(t, "W6", rep, map[string]any{"label": "mosquitto", "connections": 1000, "rate": 1, "payload": 32,
			"acked": 10000, "errors": 0, "cpu_us_per_msg": 60, "rss_max_mb": 10}))
	}
	return b.String()
}

func TestCompare_Tables(t *testing.T) {
	var out bytes.Buffer
	compare(&out, parse(t, cannedRun(t)), DefaultP99Limit)
	got := out.String()
	for _, want := range []string{
		// Knees: mosquitto 20k, mochi 40k, peat 40k then 20k (median 30k);
		// peat/mochi per repetition 1 and 0.5, peat/mosquitto 2 and 1.
		// CPU is compared at 20k, the highest rate every median knee reaches.
		"| mosquitto | 2 | 20,000 | 20,000, 20,000 | 0.50 | 1.00 | 20.0 |",
		"| mochi | 2 | 40,000 | 40,000, 40,000 | 1.00 | 2.00 | 15.0 | 1.00 | 0.75 |",
		"| peat-interval | 2 | 30,000 | 40,000, 20,000 | 0.75 | 1.50 | 22.5 | 1.50 | 1.12 |",
		"CPU µs/msg at 20,000",
		// Every point: mosquitto lost 1,000 in each repetition at 40k.
		"| 40,000 | mosquitto | 0/2 | 40,000 | 40,000 | 2,000 | 0 | 225 / 900 / 1,800 |",
		"| 40,000 | peat-interval | 1/2 |",
		// W2: loss is summed over the repetitions, rates are medians.
		"| mosquitto | 2/2 | 5,000 | 80,000 | 0 | 1.00 / 5.00 / 9.00 |",
		"| peat-interval | 2/2 | 45,000 | 0 | 0 |",
		// W3: 30,000 acks/s against 2,000 fsyncs/s one at a time.
		"p50 0.50 ms, p99 4.00 ms, p99.9 9.00 ms (medians of 2 runs)",
		"| peat-fsync | 2/2 | 30,000 | - / - / - | - | - / - | - | - | 15.00 |",
		"### W5: 3 nodes, acks=all\n\nNot measured.",
		"### W6: many sensors, QoS 1 (1,000 connections at 1 msg/s each, 32 B)",
		"| peat-interval | 2/2 | - | 10,000 | 0 | - / - / - | 300 | - / - / 100 / - | - | 5.00 | - | 10.00 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("tables lack %q\n%s", want, got)
		}
	}
	if strings.Contains(got, "### W4") {
		t.Error("a W4 section without W4 runs")
	}
}

func TestCommand_KneeAndCarried(t *testing.T) {
	in := cannedRun(t)
	var out bytes.Buffer
	if code, err := command("knee", []string{"peat-interval"}, strings.NewReader(in), &out); code != 0 || err != nil || out.String() != "30000\n" {
		t.Errorf("knee peat-interval: %q, exit %d, %v; want 30000", out.String(), code, err)
	}
	if code, _ := command("knee", []string{"absent"}, strings.NewReader(in), &out); code != 1 {
		t.Errorf("knee of a system without W1 runs: exit %d, want 1", code)
	}
	carriedLine := `{"received": 10, "lost": 0, "dups": 0, "e2e_p99_ms": 9.9}`
	if code, _ := command("carried", nil, strings.NewReader(carriedLine), &out); code != 0 {
		t.Errorf("carried with p99 9.9 ms: exit %d, want 0", code)
	}
	if code, _ := command("carried", []string{"--p99", "5"}, strings.NewReader(carriedLine), &out); code != 1 {
		t.Errorf("carried with p99 9.9 ms against --p99 5: exit %d, want 1", code)
	}
}

func TestParseResults_NamesABadLine(t *testing.T) {
	_, err := parseResults(strings.NewReader("# a comment\n\nW1 1 {\"label\":\"mochi\"}\nW1 x {}\n"))
	if err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("error %v, want one naming line 4", err)
	}
}

func TestWritePlot_DataAndScript(t *testing.T) {
	dir := t.TempDir()
	png := filepath.Join(dir, "out.png")
	if err := writePlot(dir, png, "test", parse(t, cannedRun(t)), DefaultP99Limit); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// Offered and delivered in thousands, the median p99 (repetition 2's
	// 25 ms and repetition 1's 4 ms at 40k).
	if got := read("w1-peat-interval.dat"); !strings.Contains(got, "\n40 40 14.5\n") {
		t.Errorf("w1-peat-interval.dat lacks the 40k point:\n%s", got)
	}
	if got := read("w2.dat"); !strings.Contains(got, "\npeat-interval 45000 NaN 5 NaN\n") {
		t.Errorf("w2.dat: want NaN (no bar) for the window 1 that did not run:\n%s", got)
	}
	gp := read("compare.gp")
	for _, want := range []string{"set output '" + png + "'", "w1-mochi.dat", "w3.dat", "w6.dat", "layout 4,2", "1 / fsync p50"} {
		if !strings.Contains(gp, want) {
			t.Errorf("compare.gp lacks %q:\n%s", want, gp)
		}
	}
	for _, absent := range []string{"w4.dat", "w5.dat", "w5-failover.dat"} {
		if strings.Contains(gp, absent) {
			t.Errorf("compare.gp plots %s without its runs", absent)
		}
	}
}

func TestKnees_RatioSkipsASweepBelowItsLowestRate(t *testing.T) {
	ok := run{"rate": 10.0, "received": 1.0, "lost": 0.0, "dups": 0.0, "e2e_p99_ms": 1.0}
	bad := run{"rate": 10.0, "received": 1.0, "lost": 3.0, "dups": 0.0, "e2e_p99_ms": 1.0}
	kn := map[string]reps{
		"mochi": knees(map[int]sweep{1: {10: ok}, 2: {10: ok}}, DefaultP99Limit),
		"peat":  knees(map[int]sweep{1: {10: bad}, 2: {10: ok}}, DefaultP99Limit),
		"slow":  knees(map[int]sweep{1: {10: bad}, 2: {10: bad}}, DefaultP99Limit),
	}
	// Repetition 1 found no knee for peat: only repetition 2 (1.00) counts,
	// not a ratio of 0.
	if got := ratioCell(kn["peat"], kn, vs("", "found", "mochi")); got != "1.00" {
		t.Errorf("peat/mochi knee ratio %s, want 1.00 from the one repetition with a knee", got)
	}
	if got := ratioCell(kn["slow"], kn, vs("", "found", "mochi")); got != "-" {
		t.Errorf("ratio of a system that never carried the lowest rate: %s, want -", got)
	}
}

// W5 compares the site with the single fsync node of the same repetition,
// sharing a core and again capped, and shows the failover times.
func TestCompare_W5(t *testing.T) {
	var out bytes.Buffer
	compare(&out, parse(t, w5Run(t)), 10)
	got := out.String()
	for _, want := range []string{
		"| peat-site-3 | 2/2 | 9,000 |", // median of 6,000 and 12,000
		"| 0.60 |",                      // 6,000/10,000 and 12,000/20,000
		"| 30.0 / 60.0 |",               // the leader's CPU per message, then the three nodes'
		"| 3.00 |",                      // all nodes' CPU per message against the single node's
		"| peat-site-3 | 1/1 | 10.0 | 2,500 / 3,100 |",
		"equal share of that core",
		"| 0.80 |", // capped: 2,400/3,000 and 4,800/6,000
	} {
		if !strings.Contains(got, want) {
			t.Errorf("tables lack %q\n%s", want, got)
		}
	}
}

// w5Run is a bench.sh W5 of two repetitions: the site at 0.6x peat-fsync in
// each, at 0.8x with the nodes capped, and one round of 10 leader kills.
func w5Run(t testing.TB) string {
	var in strings.Builder
	for rep := 1; rep <= 2; rep++ {
		in.WriteString(line(t, "W5", rep, map[string]any{"label": "peat-fsync", "acked_per_s": 10000.0 * float64(rep), "lost": 0, "dups": 0,
			"cpu_us_per_msg": 20.0, "all_cpu_us_per_msg": 20.0}))
		in.WriteString(line(t, "W5", rep, map[string]any{"label": "peat-site-3", "acked_per_s": 6000.0 * float64(rep), "lost": 0, "dups": 0,
			"cpu_us_per_msg": 30.0, "all_cpu_us_per_msg": 60.0}))
		in.WriteString(line(t, "W5/capped", rep, map[string]any{"label": "peat-fsync", "acked_per_s": 3000.0 * float64(rep), "lost": 0, "dups": 0,
			"cpu_us_per_msg": 20.0, "all_cpu_us_per_msg": 20.0}))
		in.WriteString(line(t, "W5/capped", rep, map[string]any{"label": "peat-site-3", "acked_per_s": 2400.0 * float64(rep), "lost": 0, "dups": 0,
			"cpu_us_per_msg": 25.0, "all_cpu_us_per_msg": 50.0}))
	}
	in.WriteString(line(t, "W5/failover", 1, map[string]any{"label": "peat-site-3", "kills": 10, "resume_median_ms": 2500.0, "resume_max_ms": 3100.0}))
	return in.String()
}

// The chart has W5's panels: the site's acks/s beside peat-fsync's with the
// ratio over the site's bar and the 0.5x target, and the failover median and
// max against 5 s.
func TestWritePlot_W5(t *testing.T) {
	write := func(t *testing.T, in string) (string, func(string) string) {
		dir := t.TempDir()
		if err := writePlot(dir, filepath.Join(dir, "out.png"), "test", parse(t, in), DefaultP99Limit); err != nil {
			t.Fatal(err)
		}
		read := func(name string) string {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		return read("compare.gp"), read
	}
	t.Run("acks and failover", func(t *testing.T) {
		gp, read := write(t, cannedRun(t)+w5Run(t))
		// Medians 15,000 and 9,000; the ratio within each repetition 0.6.
		for _, want := range []string{"\npeat-fsync 15000 \"\"\n", "\npeat-site-3 9000 \"0.60x peat-fsync\"\n"} {
			if got := read("w5.dat"); !strings.Contains(got, want) {
				t.Errorf("w5.dat lacks %q:\n%s", want, got)
			}
		}
		if got := read("w5-capped.dat"); !strings.Contains(got, "\npeat-site-3 3600 \"0.80x peat-fsync\"\n") {
			t.Errorf("w5-capped.dat lacks the capped site's median and ratio:\n%s", got)
		}
		if got := read("w5-failover.dat"); !strings.Contains(got, "\npeat-site-3 2500 3100\n") {
			t.Errorf("w5-failover.dat lacks the median and max:\n%s", got)
		}
		// Seven panels without W5 (four rows), ten with its three.
		for _, want := range []string{"layout 5,2", "w5.dat", "7500 with lines dt 2 lc 'red' title 'target: 0.5x peat-fsync'",
			"w5-capped.dat", "2250 with lines dt 2 lc 'red'", "each node an equal share of one core",
			"w5-failover.dat", "(10 kills)", "5000 with lines dt 2 lc 'red' title 'target 5000 ms'"} {
			if !strings.Contains(gp, want) {
				t.Errorf("compare.gp lacks %q:\n%s", want, gp)
			}
		}
		if i, j := strings.Index(gp, "w3.dat"), strings.Index(gp, "w5.dat"); j < i {
			t.Error("W5 drawn before W3: panels go in workload order")
		}
	})
	t.Run("failed kill round", func(t *testing.T) {
		in := strings.Replace(w5Run(t), `"kills":10`, `"error":"cluster/sitetest leader kills failed","kills":10`, 1)
		gp, _ := write(t, in)
		if !strings.Contains(gp, "w5.dat") || strings.Contains(gp, "w5-failover.dat") {
			t.Errorf("with the kill round failed: want the acks panel and no failover panel:\n%s", gp)
		}
	})
}

// compare.gp draws with Debian's gnuplot, as bench.sh runs it, whatever
// ran or failed: one panel gnuplot refuses loses the whole chart.
// scripts/test-deps.sh installs gnuplot.
func TestWritePlot_GnuplotDraws(t *testing.T) {
	path, err := exec.LookPath("gnuplot")
	if err != nil {
		t.Fatalf("gnuplot not found (Debian: apt-get install gnuplot-nox; make test-deps installs it): %v", err)
	}
	failed := func(tag, label string) string {
		return line(t, tag, 1, map[string]any{"label": label, "error": "failed"})
	}
	for _, tc := range []struct{ name, in string }{
		// cannedRun has no W2 window 1: a column of NaN.
		{"every workload, W2 window 1 absent", cannedRun(t) + w5Run(t)},
		{"every run of a workload failed", failed("W2/16", "mochi") + failed("W3", "peat-fsync") + failed("W4/qos0", "peat-interval") +
			failed("W5", "peat-fsync") + failed("W5", "peat-site-3") + failed("W5/capped", "peat-fsync") + failed("W5/capped", "peat-site-3") +
			failed("W5/failover", "peat-site-3") + failed("W6", "mochi") +
			line(t, "fsync", 1, map[string]any{"label": "disk", "per_s_at_p50": 2000})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			png := filepath.Join(dir, "compare.png")
			if err := writePlot(dir, png, "test", parse(t, tc.in), DefaultP99Limit); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(path, filepath.Join(dir, "compare.gp")).CombinedOutput()
			if err != nil || len(out) > 0 {
				t.Fatalf("gnuplot: %v\n%s", err, out)
			}
			b, err := os.ReadFile(png)
			if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
				t.Fatalf("no PNG drawn: %v", err)
			}
		})
	}
}
