#!/usr/bin/env bash
# Fan-in benchmark: Peat (durability fsync and interval) beside plain mochi
# and Mosquitto (default queues, and max_queued_messages 0), each a fresh
# process per run, broker pinned to CPU 0 and the load to CPU 1, the order of
# systems reversed every other repetition, REPS repetitions. Prints the JSON
# lines and a markdown table of medians with the median of the
# per-repetition ratios to mochi.
#
#   scripts/bench-fanin.sh            # defaults below
#   REPS=5 COUNT=40000 scripts/bench-fanin.sh
#   SYSTEMS="mochi peat-fsync" scripts/bench-fanin.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

REPS=${REPS:-3}
COUNT=${COUNT:-20000}         # messages per publisher
PUBS=${PUBS:-10}
WINDOW=${WINDOW:-16}
PAYLOAD=${PAYLOAD:-128}
QOS0_RATE=${QOS0_RATE:-20000} # offered msg/s for the QoS 0 CPU-per-message run
read -r -a systems <<<"${SYSTEMS:-mochi mosquitto mosquitto-unlimited peat-fsync peat-interval}"
work=$(mktemp -d)
trap 'stop_system; rm -rf "$work"' EXIT

bench_need_mosquitto "${systems[@]}"
bench_build

run() { # name workload-flags...
	local name=$1; shift
	start_system "$name"
	local line
	line=$($pin_load "$work/peat-bench" fanin --addr 127.0.0.1:$PORT --pid "$PID" --label "$name" "$@")
	echo "$line"
	echo "$rep $line" >>"$work/results.txt"
	stop_system
}

for rep in $(seq "$REPS"); do
	order=("${systems[@]}")
	if [ $((rep % 2)) -eq 0 ]; then # alternate the order: no system always runs first
		order=()
		for ((i = ${#systems[@]} - 1; i >= 0; i--)); do order+=("${systems[i]}"); done
	fi
	for s in "${order[@]}"; do
		run "$s" --qos 1 --window "$WINDOW" --publishers "$PUBS" --payload "$PAYLOAD" --count "$COUNT"
		run "$s" --qos 0 --publishers "$PUBS" --payload "$PAYLOAD" --count "$COUNT" --rate "$QOS0_RATE"
	done
done

go run ./scripts/benchtable <"$work/results.txt"
