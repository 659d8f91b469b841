package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// The baselines every Peat figure is divided by, within each repetition.
const (
	baseMochi     = "mochi"
	baseMosquitto = "mosquitto"
	basePeatFsync = "peat-fsync" // W5: a site against one node
)

// compare writes the markdown tables of a bench.sh run, one section per
// workload, in workload order; a workload with no runs is left out, except
// W5, whose place is kept.
func compare(w io.Writer, res *results, limit float64) {
	if res.hasTag("W1") {
		w1Tables(w, res, limit)
	}
	for _, win := range []string{"16", "1"} {
		if tag := "W2/" + win; res.hasTag(tag) {
			fmt.Fprintf(w, "\n### W2: QoS 1 fan-in, window %s (10 publishers → 1 subscriber, %s B, unthrottled)\n\n", win, payloadOf(res, tag))
			table(w, "system", res.bySystem(tag), res.systems, []column{
				col("delivered/s", "delivered_per_s"), total("lost", "lost"), total("dups", "dups"),
				col("PUBACK p50 / p99 / p99.9 ms", "puback_p50_ms", "puback_p99_ms", "puback_p999_ms"),
				col("e2e p50 / p99 / p99.9 ms", "e2e_p50_ms", "e2e_p99_ms", "e2e_p999_ms"),
				col("CPU µs/msg", "cpu_us_per_msg"), col("RSS idle / peak MB", "rss_idle_mb", "rss_peak_mb"),
			}, []ratio{
				vs("delivered/s vs mochi", "delivered_per_s", baseMochi), vs("delivered/s vs mosquitto", "delivered_per_s", baseMosquitto),
				vs("PUBACK p99 vs mochi", "puback_p99_ms", baseMochi), vs("PUBACK p99 vs mosquitto", "puback_p99_ms", baseMosquitto),
			})
		}
	}
	if res.hasTag("W3") || res.hasTag("fsync") {
		w3Tables(w, res)
	}
	if res.hasTag("W4/qos0") || res.hasTag("W4/qos1") || res.hasTag("W4/load") {
		w4Tables(w, res, limit)
	}
	fmt.Fprintf(w, "\n### W5: 3 nodes, acks=all\n\n")
	if res.hasTag("W5") {
		fmt.Fprintf(w, "QoS 1 fan-in, window 16, against the stream's leader of a three-node site on this one machine, beside a single node with fsync in the same repetition. The three nodes share one core, which the single node has alone.\n\n")
		w5Table(w, res, "W5")
	} else {
		fmt.Fprintln(w, "Not measured.")
	}
	if res.hasTag("W5/capped") {
		fmt.Fprintf(w, "\nThe same, with every node (the single one too) held to an equal share of that core by a CPU quota (bench.sh W5_CAP): three equal machines against one of them. The disk is still shared.\n\n")
		w5Table(w, res, "W5/capped")
	}
	if res.hasTag("W5/failover") {
		fmt.Fprintf(w, "\nLeader kill -9 under QoS 1 load (cluster/sitetest): time from the kill to the first acknowledgement of a message sent after it.\n\n")
		table(w, "system", res.bySystem("W5/failover"), res.systems, []column{
			col("kills", "kills"), col("resume median / max ms", "resume_median_ms", "resume_max_ms"),
		}, nil)
	}
	if res.hasTag("W6") {
		fmt.Fprintf(w, "\n### W6: many sensors, QoS 1 (%s connections at %s msg/s each, %s B)\n\n",
			anyOf(res, "W6", "connections"), anyOf(res, "W6", "rate"), anyOf(res, "W6", "payload"))
		table(w, "system", res.bySystem("W6"), res.systems, []column{
			col("connected", "connected"), col("acked", "acked"), total("errors", "errors"),
			col("PUBACK p50 / p99 / p99.9 ms", "puback_p50_ms", "puback_p99_ms", "puback_p999_ms"),
			col("CPU µs/msg", "cpu_us_per_msg"),
			col("RSS idle / connected / under load / peak MB", "rss_idle_mb", "rss_connected_mb", "rss_max_mb", "rss_peak_mb"),
		}, []ratio{
			vs("CPU/msg vs mochi", "cpu_us_per_msg", baseMochi), vs("CPU/msg vs mosquitto", "cpu_us_per_msg", baseMosquitto),
			vs("RSS under load vs mochi", "rss_max_mb", baseMochi), vs("RSS under load vs mosquitto", "rss_max_mb", baseMosquitto),
		})
	}
}

// w5Table writes a site's fan-in beside the single node's of tag.
func w5Table(w io.Writer, res *results, tag string) {
	table(w, "system", res.bySystem(tag), res.systems, []column{
		col("acked/s", "acked_per_s"), col("delivered/s", "delivered_per_s"), total("lost", "lost"), total("dups", "dups"),
		col("PUBACK p50 / p99 / p99.9 ms", "puback_p50_ms", "puback_p99_ms", "puback_p999_ms"),
		col("CPU µs/msg, the node taking the load / all nodes", "cpu_us_per_msg", "all_cpu_us_per_msg"),
	}, []ratio{vs("acked/s vs peat-fsync", "acked_per_s", basePeatFsync), vs("CPU/msg, all nodes, vs peat-fsync", "all_cpu_us_per_msg", basePeatFsync)})
}

// w1Tables writes the knee of each system, then every point of the sweep.
func w1Tables(w io.Writer, res *results, limit float64) {
	sw := res.sweeps("W1")
	kn := map[string]reps{}
	for sys, bySweep := range sw {
		kn[sys] = knees(bySweep, limit)
	}
	rates := allRates(sw)
	ref := referenceRate(kn, rates)
	fmt.Fprintf(w, "\n### W1: QoS 0 fan-in rate sweep (10 publishers → 1 subscriber, %s B)\n\n", payloadOf(res, "W1"))
	fmt.Fprintf(w, "Knee: the highest offered rate carried with nothing lost or duplicated and an end-to-end p99 below %g ms, every lower rate carried too (shown as < the lowest rate when that already failed). ", limit)
	fmt.Fprintf(w, "CPU per message is compared at %s msg/s, the highest rate at or below every system's median knee.\n\n", num(ref))
	heads := []string{"system", "runs", "knee msg/s", "knee per run", "knee vs mochi", "knee vs mosquitto",
		"CPU µs/msg at " + num(ref), "CPU/msg vs mochi", "CPU/msg vs mosquitto", "RSS idle / peak MB at " + num(ref)}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(heads, " | "), strings.Repeat("---|", len(heads)))
	atRef := map[string]reps{}
	for sys, bySweep := range sw {
		atRef[sys] = atRate(bySweep, ref)
	}
	for _, sys := range res.systems {
		if sw[sys] == nil {
			continue
		}
		var per []string
		for _, rep := range kn[sys].sorted() {
			per = append(per, kneeText(kn[sys][rep].num("knee"), rates))
		}
		k, _ := kn[sys].median("knee")
		row := []string{sys, fmt.Sprint(len(sw[sys])), kneeText(k, rates), strings.Join(per, ", "),
			ratioCell(kn[sys], kn, vs("", "found", baseMochi)), ratioCell(kn[sys], kn, vs("", "found", baseMosquitto)),
			cell(atRef[sys], col("", "cpu_us_per_msg")),
			ratioCell(atRef[sys], atRef, vs("", "cpu_us_per_msg", baseMochi)),
			ratioCell(atRef[sys], atRef, vs("", "cpu_us_per_msg", baseMosquitto)),
			cell(atRef[sys], col("", "rss_idle_mb", "rss_peak_mb")),
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}

	fmt.Fprintf(w, "\nEvery point of the sweep (a system's sweep stops after its second failed rate):\n\n")
	cols := []column{
		col("offered achieved/s", "offered_per_s"), col("delivered/s", "delivered_per_s"),
		total("lost", "lost"), total("dups", "dups"),
		col("e2e p50 / p99 / p99.9 ms", "e2e_p50_ms", "e2e_p99_ms", "e2e_p999_ms"),
		col("CPU µs/msg", "cpu_us_per_msg"), col("RSS idle / peak MB", "rss_idle_mb", "rss_peak_mb"),
	}
	heads = []string{"offered msg/s", "system", "carried"}
	for _, c := range cols {
		heads = append(heads, c.head)
	}
	heads = append(heads, "CPU/msg vs mochi", "CPU/msg vs mosquitto")
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(heads, " | "), strings.Repeat("---|", len(heads)))
	for _, rate := range rates {
		at := map[string]reps{}
		for sys, bySweep := range sw {
			if rs := atRate(bySweep, rate); len(rs) > 0 {
				at[sys] = rs
			}
		}
		for _, sys := range res.systems {
			rs := at[sys]
			if rs == nil {
				continue
			}
			ok := 0
			for _, r := range rs {
				if carried(r, limit) {
					ok++
				}
			}
			row := []string{num(rate), sys, fmt.Sprintf("%d/%d", ok, len(rs))}
			for _, c := range cols {
				row = append(row, cell(rs, c))
			}
			row = append(row, ratioCell(rs, at, vs("", "cpu_us_per_msg", baseMochi)), ratioCell(rs, at, vs("", "cpu_us_per_msg", baseMosquitto)))
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
	}
}

// kneeText shows a knee of 0 as "< lowest rate": the sweep never found a
// rate the system carried.
func kneeText(k float64, rates []float64) string {
	if k == 0 && len(rates) > 0 {
		return "< " + num(rates[0])
	}
	return num(k)
}

// referenceRate is the highest swept rate at or below every system's median
// knee, where all of them carried the load, so CPU per message compares
// like with like; the lowest rate when there is none.
func referenceRate(kn map[string]reps, rates []float64) float64 {
	if len(rates) == 0 {
		return 0
	}
	lowest := -1.0
	for _, rs := range kn {
		k, _ := rs.median("knee")
		if lowest < 0 || k < lowest {
			lowest = k
		}
	}
	ref := rates[0]
	for _, r := range rates {
		if r <= lowest {
			ref = r
		}
	}
	return ref
}

// w3Tables writes the durable QoS 1 ingest (no subscriber) of every system
// and the disk's own fdatasync latency measured in the same repetitions.
func w3Tables(w io.Writer, res *results) {
	fs := res.byRep("fsync")
	fmt.Fprintf(w, "\n### W3: durable QoS 1 ingest (10 publishers, window 16, %s B, no subscriber)\n\n", payloadOf(res, "W3"))
	if len(fs) > 0 {
		dir := ""
		for _, r := range fs {
			dir = r.str("dir")
		}
		p50, _ := fs.median("fsync_p50_ms")
		p99, _ := fs.median("fsync_p99_ms")
		p999, _ := fs.median("fsync_p999_ms")
		per, _ := fs.median("per_s_at_p50")
		fmt.Fprintf(w, "The disk: %s-byte appends, each followed by fdatasync, on the data directories' filesystem (%s): "+
			"p50 %s ms, p99 %s ms, p99.9 %s ms (medians of %d runs). One durable write at a time would give 1/p50 = %s/s; "+
			"the last column is acks/s divided by that, within each repetition: how many acknowledgements share one fsync's time.\n\n",
			anyOf(res, "fsync", "block"), dir, num(p50), num(p99), num(p999), fs.measured(), num(per))
	}
	if !res.hasTag("W3") {
		return
	}
	table(w, "system", res.bySystem("W3"), res.systems, []column{
		col("acked/s", "acked_per_s"), col("PUBACK p50 / p99 / p99.9 ms", "puback_p50_ms", "puback_p99_ms", "puback_p999_ms"),
		col("CPU µs/msg", "cpu_us_per_msg"), col("RSS idle / peak MB", "rss_idle_mb", "rss_peak_mb"),
	}, []ratio{
		vs("acked/s vs mochi", "acked_per_s", baseMochi), vs("acked/s vs mosquitto", "acked_per_s", baseMosquitto),
		{head: "acks/s ÷ (1/fsync p50)", key: "acked_per_s", against: fs, baseKey: "per_s_at_p50"},
	})
}

// The replay targets (W4).
const (
	targetReplayQoS0 = 200000 // msg/s
	targetReplayQoS1 = 50000  // msg/s, window 100
	targetReplayRSS  = 50     // MB above idle
)

// w4Tables writes Peat's replay runs, compared with Mosquitto's W1 knee of
// the same repetition (its live delivery capacity: Mosquitto has no replay).
func w4Tables(w io.Writer, res *results, limit float64) {
	variants := []struct{ tag, name string }{
		{"W4/qos0", "QoS 0, alone"}, {"W4/qos1", "QoS 1, alone"}, {"W4/load", "QoS 0, during W1 fan-in"},
	}
	groups := map[string]reps{}
	var names []string
	system := ""
	for _, v := range variants {
		if rs := res.byRep(v.tag); len(rs) > 0 {
			groups[v.name] = rs
			names = append(names, v.name)
			for _, r := range rs {
				system = r.str("label")
			}
		}
	}
	var mosqKnee reps
	if sw := res.sweeps("W1")[baseMosquitto]; sw != nil {
		mosqKnee = knees(sw, limit)
	}
	count := anyOf(res, "W4/qos0", "count")
	if count == "-" {
		count = anyOf(res, "W4/qos1", "count")
	}
	fmt.Fprintf(w, "\n### W4: replay of %s records from offset 0 (%s; Peat only, the others have no replay)\n\n", count, system)
	if fill := res.byRep("W4/fill"); len(fill) > 0 {
		per, _ := fill.median("fill_per_s")
		fmt.Fprintf(w, "Filled once with QoS 1 publishes at %s records/s; Peat restarted on that data before every replay. ", num(per))
	}
	fmt.Fprintf(w, "The QoS 1 consumer is MQTT 5 with Receive Maximum %s. Targets: QoS 0 ≥ %s msg/s, QoS 1 ≥ %s msg/s, RSS within %d MB of idle.\n\n",
		anyOf(res, "W4/qos1", "window"), num(targetReplayQoS0), num(targetReplayQoS1), targetReplayRSS)
	table(w, "consumer", groups, names, []column{
		col("msg/s", "msg_per_s"), total("missing / dups / reordered", "missing", "dups", "reordered"),
		col("first record ms", "first_record_ms"), col("broker CPU µs/msg", "cpu_us_per_msg"),
		col("RSS idle / peak / peak−idle MB", "rss_idle_mb", "rss_peak_mb", "rss_delta_mb"),
		col("of which anon / file peak−idle MB", "anon_delta_mb", "file_delta_mb"),
		col("fan-in offered msg/s", "load_rate"), total("fan-in lost / sent", "load_lost", "load_sent"), col("fan-in e2e p99 ms", "load_e2e_p99_ms"),
	}, []ratio{{head: "msg/s vs mosquitto's W1 knee", key: "msg_per_s", against: mosqKnee, baseKey: "found"}})
	for _, name := range names {
		rs := groups[name]
		rate, ok := rs.median("msg_per_s")
		if !ok {
			continue
		}
		want := float64(targetReplayQoS0)
		if strings.HasPrefix(name, "QoS 1") {
			want = targetReplayQoS1
		}
		worst, worstAnon := 0.0, 0.0
		for _, r := range rs {
			if !r.failed() {
				worst, worstAnon = max(worst, r.num("rss_delta_mb")), max(worstAnon, r.num("anon_delta_mb"))
			}
		}
		fmt.Fprintf(w, "\n- %s: %s msg/s against %s (%s); RSS at most %s MB above idle (%s), of which anonymous memory (heap and caches, not reclaimable page cache) %s MB (%s).",
			name, num(rate), num(want), metOr(rate >= want), num(worst), metOr(worst <= targetReplayRSS), num(worstAnon), metOr(worstAnon <= targetReplayRSS))
	}
	fmt.Fprintln(w)
}

func metOr(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// anyOf is a parameter of the workload (the same in every run), as text.
func anyOf(res *results, tag, k string) string {
	for _, p := range res.points {
		if p.tag == tag && p.r.has(k) {
			switch v := p.r[k].(type) {
			case float64:
				if v == math.Trunc(v) {
					return group(int64(v))
				}
				return num(v)
			default:
				return fmt.Sprint(v)
			}
		}
	}
	return "-"
}

func payloadOf(res *results, tag string) string { return anyOf(res, tag, "payload") }

// kneeOf is the median W1 knee of one system, for bench.sh's W4 load.
func kneeOf(res *results, sys string, limit float64) (float64, bool) {
	sw := res.sweeps("W1")[sys]
	if sw == nil {
		return 0, false
	}
	return knees(sw, limit).median("knee")
}

// systemsIn lists the systems that ran tag, in run order.
func systemsIn(res *results, tag string) []string {
	g := res.bySystem(tag)
	return slices.DeleteFunc(slices.Clone(res.systems), func(s string) bool { return g[s] == nil })
}
