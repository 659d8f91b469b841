#!/usr/bin/env bash
# make bench-compare (issue 5): every workload on every system, back to back,
# REPS repetitions, then a markdown table per workload (medians, and the
# median of the per-repetition ratios to mochi and to Mosquitto) and a chart.
#
# Systems (scripts/lib-brokers.sh starts each as a fresh process per run, the
# broker pinned to CPU 0 and the load generator to CPU 1):
#   mosquitto            Debian's Mosquitto, persistence off, default config
#   mosquitto-unlimited  the same with max_queued_messages 0 (its default drops QoS 1 for a slow subscriber)
#   mochi                plain mochi at go.mod's version, allow-all, no persistence (peat-bench mochi)
#   peat-interval        Peat, server profile, stream durability interval
#   peat-fsync           Peat, server profile, stream durability fsync (PUBACK after fdatasync)
# Every repetition runs the workloads in order, the systems in the order of
# SYSTEMS on odd repetitions and reversed on even ones:
#   W1  QoS 0 fan-in, 10 publishers -> 1 subscriber, 128 B, offered rates
#       W1_RATES for W1_SECONDS each; the knee is the highest rate carried
#       with nothing lost or duplicated and an end-to-end p99 < W1_P99_MS
#   W2  QoS 1 fan-in, window 16 and window 1, PUBACK and end-to-end latency
#   W3  QoS 1 ingest with no subscriber (Peat fsync: durable acks/s), and the
#       fdatasync latency of the data directories' filesystem, same run
#   W4  Peat only: replay of W4_COUNT records from offset 0 (QoS 0; QoS 1
#       window 100; QoS 0 while W1 runs at half of peat-interval's knee)
#   W5  3 local nodes, acks=all (scripts/site.sh): QoS 1 fan-in, window 16,
#       against the leader beside a single peat-fsync, all sharing one core;
#       again with each node held to W5_CAP percent of a core (W5/capped);
#       and the time from a leader kill -9 until acknowledgements resume
#       (W5_KILLS kills)
#   W6  SENSORS connections publishing QoS 1 at 1 msg/s: RSS and CPU per message
# Took 9 min 11 s on a quiet 2-core machine with the defaults. Installs
# Mosquitto and gnuplot (apt-get, as root or through sudo) when missing.
# Writes to scripts/.bench/: results.txt (every run's JSON line),
# tables.md, compare.png and the chart's data.
#
#   scripts/bench.sh                                # everything, REPS=3
#   REPS=1 WORKLOADS="W1 W3" scripts/bench.sh       # a subset
#   QUICK=1 scripts/bench.sh                        # tiny counts: checks the harness in about two minutes
#   scripts/bench.sh --tables scripts/.bench/results.txt   # tables and chart again from saved results
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

REPS=${REPS:-3}
read -r -a systems <<<"${SYSTEMS:-mosquitto mosquitto-unlimited mochi peat-interval peat-fsync}"
read -r -a workloads <<<"${WORKLOADS:-W1 W2 W3 W4 W5 W6}"
PUBS=10
PAYLOAD=128
IDLE=${IDLE:-0.5}                      # seconds between a broker's start and the run (its idle RSS)
W1_RATES=${W1_RATES:-"5000 10000 20000 30000 40000 60000 80000"}
W1_SECONDS=${W1_SECONDS:-2}             # publishing time per offered rate
W1_P99_MS=${W1_P99_MS:-10}
W1_MAX_FAILS=${W1_MAX_FAILS:-2}         # a system's sweep stops after this many failed rates
W2_COUNT=${W2_COUNT:-5000}              # messages per publisher, window 16
W2_COUNT_W1=${W2_COUNT_W1:-500}         # messages per publisher, window 1
W3_COUNT=${W3_COUNT:-5000}              # messages per publisher
FSYNC_COUNT=${FSYNC_COUNT:-1000}        # fdatasyncs measured per repetition
W4_SYSTEM=${W4_SYSTEM:-peat-interval}   # the Peat that replays (the log is the same for both durabilities)
W4_PROFILE=${W4_PROFILE:-server}        # its storage profile (server: the Peat of every other workload)
W4_COUNT=${W4_COUNT:-1000000}           # records filled once, then replayed from offset 0
W4_WINDOW=${W4_WINDOW:-100}             # QoS 1 consumer's Receive Maximum (and Peat's mqtt.window)
W4_LOAD_FOR=${W4_LOAD_FOR:-12s}         # how long the W1 fan-in runs beside the loaded replay
W5_KILLS=${W5_KILLS:-10}               # leader kills timed in the first repetition (0: none)
W5_CAP=${W5_CAP:-33}                   # W5/capped: each node's share of CPU 0, percent (0: not run)
SENSORS=${SENSORS:-1000}
W6_DURATION=${W6_DURATION:-10s}
if [ "${QUICK:-0}" = 1 ]; then
	REPS=${QUICK_REPS:-2} W1_RATES="5000 20000" W1_SECONDS=1 W2_COUNT=500 W2_COUNT_W1=50 W3_COUNT=500 FSYNC_COUNT=50
	W4_COUNT=20000 W4_LOAD_FOR=3s SENSORS=100 W6_DURATION=2s W5_KILLS=2
fi

out=scripts/.bench
mkdir -p "$out"

tables() { # results-file: the tables on stdout and in tables.md, the chart in compare.png
	local results=$1
	go build -o "$out/benchtable" ./scripts/benchtable
	local n day
	# Repetitions per workload: "3", or "3-5" when results of runs with
	# other REPS were put together (bench-results/tables.md). W4's fill and
	# W5's kills, run once by design, do not count.
	n=$(awk '$2 > m[$1] { m[$1] = $2 } END { for (t in m) if (m[t] > 1) { if (!lo || m[t] < lo) lo = m[t]; if (m[t] > hi) hi = m[t] }
		print (!hi ? 1 : lo == hi ? hi : lo "-" hi) }' "$results")
	# The run's day, from its header when there is one (--tables redraws).
	day=$(sed -n '1s/^## bench-compare, \([0-9-]*\) .*/\1/p' "$out/header.md" 2>/dev/null)
	{
		[ -f "$out/header.md" ] && cat "$out/header.md"
		"$out/benchtable" compare --p99 "$W1_P99_MS" --plot "$out/plot" --png "$out/compare.png" \
			--title "Peat beside Mosquitto and mochi, ${day:-$(date -u +%Y-%m-%d)}, $(nproc) cores, medians of $n repetitions" <"$results"
	} | tee "$out/tables.md"
	if command -v gnuplot >/dev/null; then
		gnuplot "$out/plot/compare.gp" && echo "chart: $out/compare.png" >&2
	else
		echo "no gnuplot: chart not drawn ($out/plot/compare.gp has its data)" >&2
	fi
}

if [ "${1:-}" = --tables ]; then
	tables "${2:?usage: $0 --tables RESULTS}"
	exit 0
fi

# Runs keep their data directories on the repository's disk (not a tmpfs
# /tmp), the filesystem whose fsync W3 measures.
work=$(mktemp -d "$PWD/$out/run.XXXXXX")
results="$out/results.txt"
: >"$results"
# shellcheck disable=SC2154 # d is the trap's own loop variable
capgroup=peat-bench-$$ # W5/capped's cgroups: capgroup.<pid>
trap 'stop_system; for d in "$work"/site-*/; do [ -d "$d" ] && scripts/site.sh down "$d"; done; rm -rf "$work"; scripts/cpu-cap.sh --remove "$capgroup"' EXIT

# Mosquitto and gnuplot from Debian, installed together when missing.
bench_need_tools() {
	local want=()
	bench_need_mosquitto # sets mosquitto_bin if it is there
	[[ " ${systems[*]} " == *" mosquitto"* && -z "$mosquitto_bin" ]] && want+=(mosquitto)
	command -v gnuplot >/dev/null || want+=(gnuplot-nox)
	[ ${#want[@]} -eq 0 ] && return 0
	echo "installing ${want[*]}" >&2
	local sudo=""
	[ "$(id -u)" -ne 0 ] && sudo="sudo"
	$sudo apt-get update -qq >&2
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >&2
	bench_need_mosquitto "${systems[@]}"
}

# W6 holds one socket per sensor in the broker and one in the load generator.
need=$((SENSORS + 1024))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
	ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
	if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
		echo "bench: open file limit $(ulimit -n) is below the $need that $SENSORS sensors need (raise the hard limit)" >&2
		exit 1
	fi
fi

t_start=$(date +%s)
bench_need_tools
bench_build
go build -o "$work/benchtable" ./scripts/benchtable
{
	echo "## bench-compare, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(awk '/^MemTotal:/{printf "%.0f", $2/1048576}' /proc/meminfo) GiB; $(uname -sr)"
	echo "- brokers: Mosquitto $("$mosquitto_bin" -h 2>/dev/null | sed -n 's/^mosquitto version //p' | head -1), mochi $(go list -m -f '{{.Version}}' github.com/mochi-mqtt/server/v2), Peat $(git describe --always --dirty 2>/dev/null); $(go version | cut -d' ' -f3)"
	echo "- command: \`${BENCH_COMMAND:-make bench-compare}\` (REPS=$REPS; W1 rates $W1_RATES for ${W1_SECONDS}s each; W5_CAP=$W5_CAP)"
	echo "- load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/header.md"
cat "$out/header.md" >&2

# record tag rep json: keeps one run's line, and prints a one-line summary.
record() {
	echo "$1 $2 $3" >>"$results"
	echo "$1 rep $2: $3" | cut -c1-220 >&2
}

# measure tag system subcommand args...: one run of peat-bench against a
# fresh broker; a failure is recorded as such and the benchmark goes on.
measure() {
	local tag=$1 name=$2 sub=$3
	shift 3
	start_system "$name"
	sleep "$IDLE"
	local line rc=0
	line=$($pin_load "$work/peat-bench" "$sub" --addr "127.0.0.1:$PORT" --pid "$PID" --label "$name" "$@") || rc=$?
	if ! kill -0 "$PID" 2>/dev/null; then
		[ "$rc" -eq 0 ] && rc=99
		echo "bench: $name exited during $tag; its log:" >&2
		tail -5 "$work/$name.log" >&2
	fi
	stop_system
	if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
		line="{\"label\":\"$name\",\"error\":\"peat-bench $sub exited $rc\"}"
	fi
	record "$tag" "$rep" "$line"
	LAST=$line
}

fanin() { measure "$1" "$2" fanin --publishers "$PUBS" --payload "$PAYLOAD" "${@:3}"; }

w1() {
	declare -A fails=()
	local rate s
	for rate in $W1_RATES; do
		for s in "${order[@]}"; do
			[ "${fails[$s]:-0}" -ge "$W1_MAX_FAILS" ] && continue
			fanin W1 "$s" --qos 0 --rate "$rate" --count $((rate * W1_SECONDS / PUBS)) --drain 1s
			"$work/benchtable" carried --p99 "$W1_P99_MS" <<<"$LAST" || fails[$s]=$((${fails[$s]:-0} + 1))
		done
	done
}

w2() {
	local s
	for s in "${order[@]}"; do
		fanin W2/16 "$s" --qos 1 --window 16 --count "$W2_COUNT" --drain 1s
		fanin W2/1 "$s" --qos 1 --window 1 --count "$W2_COUNT_W1" --drain 1s
	done
}

w3() {
	local s
	local line
	line=$($pin_load "$work/peat-bench" fsync --dir "$work" --count "$FSYNC_COUNT") || line='{"label":"disk","error":"peat-bench fsync failed"}'
	record fsync "$rep" "$line"
	for s in "${order[@]}"; do
		fanin W3 "$s" --qos 1 --window 16 --subscribers 0 --count "$W3_COUNT"
	done
}

# start_replay_peat: W4_SYSTEM on the replay's data directory, with
# mqtt.window raised to the QoS 1 consumer's Receive Maximum (the default
# window of 64 would cap it); sets PID and PORT.
start_replay_peat() {
	start_peat_on "$work/data-replay" "$W4_PROFILE" "$W4_WINDOW" "${W4_SYSTEM#peat-}" "$work/replay.log"
}

replay() { # tag rep args...
	local tag=$1 line rc=0
	shift
	start_replay_peat
	line=$($pin_load "$work/peat-bench" replay --addr "127.0.0.1:$PORT" --broker-pid "$PID" --label "$W4_SYSTEM, $W4_PROFILE profile" "$@") || rc=$?
	stop_system
	if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
		line="{\"label\":\"$W4_SYSTEM, $W4_PROFILE profile\",\"error\":\"peat-bench replay exited $rc\"}"
	fi
	record "$tag" "$rep" "$line"
}

w4() {
	if [ ! -d "$work/data-replay" ]; then # filled once; every replay restarts Peat on it
		replay W4/fill --fill "$W4_COUNT" --payload "$PAYLOAD"
	fi
	# Half of W4_SYSTEM's median W1 knee so far; half the lowest W1 rate
	# when it carried none; 20,000 msg/s when W1 did not run.
	local knee load=20000 lowest
	if knee=$("$work/benchtable" knee --p99 "$W1_P99_MS" "$W4_SYSTEM" <"$results"); then
		read -r lowest _ <<<"$W1_RATES"
		load=$(((knee > 0 ? knee : lowest) / 2))
	fi
	local common=(--count "$W4_COUNT" --from 0 --settle 1s --idle 10s)
	local modes=(qos0 qos1 load) m
	[ $((rep % 2)) -eq 0 ] && modes=(load qos1 qos0)
	for m in "${modes[@]}"; do
		case $m in
		qos0) replay W4/qos0 "${common[@]}" --qos 0 ;;
		qos1) replay W4/qos1 "${common[@]}" --qos 1 --window "$W4_WINDOW" ;;
		load) replay W4/load "${common[@]}" --qos 0 --load-rate "$load" --load-publishers "$PUBS" --load-for "$W4_LOAD_FOR" ;;
		esac
	done
}

# W5: a site of three local nodes (scripts/site.sh; acks all, the default
# in a site; the default stream, fsync), QoS 1 fan-in with window 16
# against the stream's leader, beside a single peat-fsync in the same
# repetition (order alternating). Twice:
#   W5         the three nodes share CPU 0, as the single node has it
#              alone: the site's cost in CPU and fsyncs on one machine
#              (W5_SITE_WRAP="" leaves the nodes unpinned, sharing both
#              cores with the load generator);
#   W5/capped  every node, the single one too, held to W5_CAP percent of
#              CPU 0 by a CPU quota (scripts/cpu-cap.sh; root): three
#              equal machines against one of them, the comparison Kafka's
#              replicated-against-unreplicated ratios make. The disk is
#              still shared. A run must last many 100 ms quota periods
#              (the default counts: 2-3 s); QUICK's are too short.
# Then, in the first repetition, W5_KILLS leader kill -9
# rounds of cluster/sitetest (its own QoS 1 load: six producers, one
# message in flight each, on all three nodes) time how long after each kill
# acknowledgements resume.
w5() {
	w5_pair W5 "${W5_SITE_WRAP-$pin_broker}"
	[ "$W5_CAP" -gt 0 ] && w5_capped
	[ "$rep" -eq 1 ] && [ "$W5_KILLS" -gt 0 ] && w5_failover
	return 0
}

w5_capped() {
	if ! scripts/cpu-cap.sh --check; then
		local e='"error":"no cgroup CPU quota here (scripts/cpu-cap.sh --check)"'
		record W5/capped "$rep" "{\"label\":\"peat-fsync\",$e}"
		record W5/capped "$rep" "{\"label\":\"peat-site-3\",$e}"
		return 0
	fi
	local pin_broker="$PWD/scripts/cpu-cap.sh $capgroup $W5_CAP $pin_broker" # start_once's, for the single node
	w5_pair W5/capped "$pin_broker"
	scripts/cpu-cap.sh --remove "$capgroup"
}

# w5_pair tag wrap: the single node (under start_once's pin_broker) and the
# site (each node under wrap), in the repetition's order.
w5_pair() {
	local tag=$1 wrap=$2 s
	local order5=(peat-fsync peat-site-3)
	[ $((rep % 2)) -eq 0 ] && order5=(peat-site-3 peat-fsync)
	for s in "${order5[@]}"; do
		case $s in
		peat-fsync) fanin "$tag" peat-fsync --qos 1 --window 16 --count "$W2_COUNT" --drain 1s ;;
		peat-site-3) w5_site "$tag" "$wrap" ;;
		esac
	done
}

w5_site() {
	local tag=$1 wrap=$2
	local dir=$work/site-$rep-${tag//\//-} nodes leader addr pid others line rc=0
	if ! nodes=$(PEAT_BIN=$work/peat PEAT_WRAP="$wrap" scripts/site.sh up 3 "$dir" 2>"$work/site-$rep.err"); then
		cat "$work/site-$rep.err" >&2
		record "$tag" "$rep" '{"label":"peat-site-3","error":"scripts/site.sh up failed"}'
		scripts/site.sh down "$dir" || true
		return 0
	fi
	leader=$(scripts/site.sh leader "$dir")
	addr=$(sed -n "s/^node=$leader mqtt=\([^ ]*\) .*/\1/p" <<<"$nodes")
	pid=$(sed -n "s/^node=$leader .* pid=\([0-9]*\)$/\1/p" <<<"$nodes")
	others=$(sed -n "/^node=$leader /d; s/^node=.* pid=\([0-9]*\)$/\1/p" <<<"$nodes" | paste -sd, -)
	sleep "$IDLE"
	line=$($pin_load "$work/peat-bench" fanin --addr "$addr" --pid "$pid" --other-pids "$others" --label peat-site-3 --publishers "$PUBS" \
		--payload "$PAYLOAD" --qos 1 --window 16 --count "$W2_COUNT" --drain 1s) || rc=$?
	scripts/site.sh down "$dir"
	rm -rf "$dir"
	if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
		line="{\"label\":\"peat-site-3\",\"error\":\"peat-bench fanin exited $rc\"}"
	fi
	record "$tag" "$rep" "$line"
}

w5_failover() {
	local report=$work/w5-failover.jsonl
	rm -f "$report"
	if PEAT_SITETEST=1 go test -count=1 -timeout 20m -run '^TestSite_LeaderKill$' ./cluster/sitetest/ \
		-args -sitetest.bin="$work/peat" -sitetest.rounds="$W5_KILLS" -sitetest.report="$report" >"$work/w5-failover.log" 2>&1 &&
		[ -s "$report" ]; then
		record W5/failover "$rep" "$(sed 's/"label":"leader-kill"/"label":"peat-site-3"/' "$report")"
	else
		tail -20 "$work/w5-failover.log" >&2
		record W5/failover "$rep" '{"label":"peat-site-3","error":"cluster/sitetest leader kills failed"}'
	fi
}

w6() {
	local s
	for s in "${order[@]}"; do
		measure W6 "$s" sensors --connections "$SENSORS" --rate 1 --qos 1 --payload 32 --duration "$W6_DURATION" --settle 1s
	done
}

for rep in $(seq "$REPS"); do
	order=("${systems[@]}")
	if [ $((rep % 2)) -eq 0 ]; then # alternate the order: no system always runs first
		order=()
		for ((i = ${#systems[@]} - 1; i >= 0; i--)); do order+=("${systems[i]}"); done
	fi
	for w in "${workloads[@]}"; do
		t0=$(date +%s)
		case $w in
		W1) w1 ;; W2) w2 ;; W3) w3 ;; W4) w4 ;; W5) w5 ;; W6) w6 ;;
		*) echo "bench: unknown workload $w (want W1..W6)" >&2; exit 2 ;;
		esac
		echo "== rep $rep $w: $(($(date +%s) - t0)) s" >&2
	done
done
{
	echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg); took $((($(date +%s) - t_start) / 60)) min $((($(date +%s) - t_start) % 60)) s"
	echo
} >>"$out/header.md"
cp "$results" "$out/results-$(date -u +%Y%m%dT%H%M).txt"
tables "$results"
echo "to publish this run: cp $out/tables.md $out/compare.png scripts/bench-results/" >&2
