#!/usr/bin/env bash
# Replay benchmark (issue 3's targets, issue 5's W4). Per storage profile: a
# fresh Peat is filled with COUNT records of PAYLOAD bytes, then they are
# replayed from offset 0 through $replay/earliest/+/bench/replay/# to one
# QoS 0 consumer and to one QoS 1 consumer (MQTT 5, Receive Maximum WINDOW),
# REPS times each, the order alternating. Peat is restarted on the same data
# before every replay, so each replay starts from a fresh process's idle RSS
# (the kernel's page cache stays warm). Every delivered offset is checked:
# each exactly once, in order. The broker is pinned to CPU 0 and the load
# generator to CPU 1 (scripts/lib-brokers.sh). With MOSQUITTO=1 (default),
# Mosquitto's live delivery (10 QoS 0 publishers to 1 subscriber,
# unthrottled) is measured in the same run for reference. Prints the JSON
# lines and a markdown table.
#
#   scripts/bench-replay.sh                       # defaults below
#   COUNT=200000 REPS=1 PROFILES=pi scripts/bench-replay.sh
#   LOAD_RATE=10000 scripts/bench-replay.sh       # also a QoS 0 replay while a QoS 0 fan-in (W1) runs at 10k msg/s;
#                                                 # its idle RSS and CPU per message then include the fan-in
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

REPS=${REPS:-3}
COUNT=${COUNT:-1000000}    # records filled and replayed
PAYLOAD=${PAYLOAD:-128}
WINDOW=${WINDOW:-100}      # QoS 1 consumer's Receive Maximum; also Peat's mqtt.window
DURABILITY=${DURABILITY:-interval}
LOAD_RATE=${LOAD_RATE:-0}  # > 0: a third replay (QoS 0) while 10 publishers send this many msg/s to bench/<id>
LOAD_FOR=${LOAD_FOR:-60s}  # how long that fan-in publishes (it starts 1 s before the replay)
MOSQUITTO=${MOSQUITTO:-1}
read -r -a profiles <<<"${PROFILES:-server pi pi-zero}"
work=$(mktemp -d)
trap 'stop_system; rm -rf "$work"' EXIT

# start_peat profile datadir: Peat on a fresh port pair with its window set
# to WINDOW (lib-brokers' Peat configs keep the default window of 64, which
# would cap the consumer's Receive Maximum); sets PID and PORT.
start_peat() { start_peat_on "$2" "$1" "$WINDOW" "$DURABILITY" "$work/peat-$1.log"; }

bench() { $pin_load "$work/peat-bench" "$@"; }

# record tag json: prints the line and keeps it for the table.
record() {
	echo "$1 $2"
	echo "$1 $2" >>"$work/results.txt"
}

[ "$MOSQUITTO" = 1 ] && bench_need_mosquitto mosquitto
bench_build
echo "load before: $(uptime)"

modes=(qos0 qos1)
[ "$LOAD_RATE" -gt 0 ] && modes+=(qos0-load)
for profile in "${profiles[@]}"; do
	data="$work/data-$profile"
	start_peat "$profile" "$data"
	record "$profile fill" "$(bench replay --addr "127.0.0.1:$PORT" --fill "$COUNT" --payload "$PAYLOAD" --broker-pid "$PID" --label "peat-$profile")"
	stop_system
	# The first start after the fill compacts what the fill left: let it,
	# so that every repetition starts from the same state.
	start_peat "$profile" "$data"
	sleep 15
	stop_system
	for rep in $(seq "$REPS"); do
		order=("${modes[@]}")
		if [ $((rep % 2)) -eq 0 ]; then # alternate the order: no mode always runs first
			order=()
			for ((i = ${#modes[@]} - 1; i >= 0; i--)); do order+=("${modes[i]}"); done
		fi
		for mode in "${order[@]}"; do
			start_peat "$profile" "$data"
			args=(replay --addr "127.0.0.1:$PORT" --count "$COUNT" --window "$WINDOW" --broker-pid "$PID"
				--settle 2s --idle 10s --label "peat-$profile")
			case $mode in
			qos0) args+=(--qos 0) ;;
			qos1) args+=(--qos 1) ;;
			qos0-load) args+=(--qos 0 --load-rate "$LOAD_RATE" --load-for "$LOAD_FOR") ;;
			esac
			record "$profile $mode" "$(bench "${args[@]}")"
			stop_system
		done
	done
done

if [ "$MOSQUITTO" = 1 ]; then
	for rep in $(seq "$REPS"); do
		start_system mosquitto
		record "mosquitto live" "$(bench fanin --addr "127.0.0.1:$PORT" --pid "$PID" --label mosquitto \
			--qos 0 --publishers 10 --payload "$PAYLOAD" --count 20000)"
		stop_system
	done
fi
echo "load after: $(uptime)"

# The table: medians over the repetitions, the spread (min-max), every
# gap, duplicate and reordering summed, and the issue's targets.
awk -v count="$COUNT" -v window="$WINDOW" -v payload="$PAYLOAD" '
function val(s, k,   r) {
	if (!match(s, "\"" k "\":[^,}]*")) return ""
	r = substr(s, RSTART + length(k) + 3, RLENGTH - length(k) - 3)
	gsub(/"/, "", r)
	return r
}
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	lo = a[1]; hi = a[n]
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function fmtn(x,   s, r) {
	s = sprintf("%.0f", x); r = ""
	while (length(s) > 3) { r = "," substr(s, length(s) - 2) r; s = substr(s, 1, length(s) - 3) }
	return s r
}
{
	key = $1 " " $2; line = $0
	if ($2 == "fill") { fill[$1] = val(line, "fill_per_s"); next }
	if ($1 == "mosquitto") { mosq = mosq " " val(line, "delivered_per_s"); mcpu = mcpu " " val(line, "cpu_us_per_msg"); mlost += val(line, "lost"); next }
	if (!(key in n)) keys[++nk] = key
	n[key]++
	rate[key] = rate[key] " " val(line, "msg_per_s")
	bad[key] += val(line, "missing") + val(line, "dups") + val(line, "reordered") + val(line, "outside") + val(line, "bad_topics")
	gaps[key] += val(line, "missing"); dups[key] += val(line, "dups"); reord[key] += val(line, "reordered")
	cpu[key] = cpu[key] " " val(line, "cpu_us_per_msg")
	busy[key] = busy[key] " " 100 * val(line, "broker_cpu_s") / val(line, "seconds")
	wait[key] = wait[key] " " 100 * val(line, "broker_wait_s") / val(line, "seconds")
	idle[key] = idle[key] " " val(line, "rss_idle_mb"); peak[key] = peak[key] " " val(line, "rss_peak_mb")
	delta[key] = delta[key] " " val(line, "rss_delta_mb"); anon[key] = anon[key] " " val(line, "anon_delta_mb")
	file[key] = file[key] " " val(line, "file_delta_mb")
	if (val(line, "rss_delta_mb") + 0 > maxdelta[key]) maxdelta[key] = val(line, "rss_delta_mb") + 0
	if (val(line, "load_rate") != "") {
		lrate[key] = val(line, "load_rate")
		llost[key] = llost[key] (llost[key] == "" ? "" : ", ") val(line, "load_lost") "/" val(line, "load_sent")
		lp99[key] = lp99[key] (lp99[key] == "" ? "" : ", ") sprintf("%.0f", val(line, "load_e2e_p99_ms"))
		if (val(line, "load_covered_replay") != "true") luncovered[key]++
	}
}
END {
	printf "\nReplay of %s records of %s B from offset 0, one consumer (MQTT 5; QoS 1 window %s); medians of %s runs, min-max in brackets\n\n", fmtn(count), payload, window, n[keys[1]]
	print "| profile | consumer | msg/s | gaps / dups / reordered | broker CPU us/msg | broker CPU / run-queue wait, % of the replay | RSS idle MB | RSS peak MB | peak - idle MB (max) | of which anon / file MB | target msg/s | target RSS |"
	print "|---|---|---|---|---|---|---|---|---|---|---|---|"
	for (i = 1; i <= nk; i++) {
		k = keys[i]; split(k, p, " ")
		r = median(rate[k]); rlo = lo; rhi = hi
		want = p[2] ~ /^qos1/ ? 50000 : 200000
		cons = p[2] == "qos1" ? "QoS 1" : p[2] == "qos0" ? "QoS 0" : \
			sprintf("QoS 0 while a QoS 0 fan-in runs at %s msg/s (fan-in lost/sent %s; e2e p99 ms %s%s)", fmtn(lrate[k]), llost[k], lp99[k],
				luncovered[k] ? sprintf("; in %d runs the fan-in ended before the replay", luncovered[k]) : "")
		printf "| %s | %s | %s [%s-%s] | %d / %d / %d | %.1f | %.0f / %.0f | %.0f | %.0f | %.0f (%.0f) | %.0f / %.0f | %s %s | %s |\n",
			p[1], cons, fmtn(r), fmtn(rlo), fmtn(rhi), gaps[k], dups[k], reord[k], median(cpu[k]), median(busy[k]), median(wait[k]),
			median(idle[k]), median(peak[k]), median(delta[k]), maxdelta[k], median(anon[k]), median(file[k]),
			fmtn(want), (r >= want ? "met" : "missed"), (maxdelta[k] <= 50 ? "met" : "missed")
	}
	printf "\nFill (QoS 1, 4 connections x 64 in flight), records/s:"
	for (f in fill) printf " %s %s;", f, fmtn(fill[f])
	print ""
	if (mosq != "") {
		m = median(mosq); mlo = lo; mhi = hi; mc = median(mcpu)
		printf "\nMosquitto, live delivery in the same run (10 QoS 0 publishers -> 1 subscriber, unthrottled): %s msg/s [%s-%s], %d lost, %.1f us of broker CPU per message.\n", fmtn(m), fmtn(mlo), fmtn(mhi), mlost, mc
		for (i = 1; i <= nk; i++) if (keys[i] ~ / qos0$/)
			printf "Peat %s QoS 0 replay / Mosquitto live: %.1fx the rate, %.1fx less broker CPU per message.\n", substr(keys[i], 1, index(keys[i], " ") - 1), median(rate[keys[i]]) / m, mc / median(cpu[keys[i]])
	}
}' "$work/results.txt"
