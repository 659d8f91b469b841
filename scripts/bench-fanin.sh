#!/usr/bin/env bash
# Fan-in benchmark: Peat (durability fsync and interval) beside plain mochi,
# each a fresh process per run, broker pinned to CPU 0 and the load to CPU 1,
# systems alternated, REPS repetitions. Prints the JSON lines and a markdown
# table of medians with the median of the per-repetition ratios peat/mochi.
#
#   scripts/bench-fanin.sh            # defaults below
#   REPS=5 COUNT=40000 scripts/bench-fanin.sh
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-3}
COUNT=${COUNT:-20000}         # messages per publisher
PUBS=${PUBS:-10}
WINDOW=${WINDOW:-16}
PAYLOAD=${PAYLOAD:-128}
QOS0_RATE=${QOS0_RATE:-20000} # offered msg/s for the QoS 0 CPU-per-message run
PORT=${PORT:-18831}
work=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$work"' EXIT

CGO_ENABLED=0 go build -o "$work/peat" ./cmd/peat
CGO_ENABLED=0 go build -o "$work/peat-bench" ./cmd/peat-bench
pin_broker="taskset -c 0"; pin_load="taskset -c 1"
command -v taskset >/dev/null || { pin_broker=""; pin_load=""; }

start_system() { # name -> sets PID
	local name=$1 data="$work/data-$RANDOM"
	case $name in
	mochi) $pin_broker "$work/peat-bench" mochi --listen 127.0.0.1:$PORT >"$work/$name.log" 2>&1 & ;;
	peat-fsync | peat-interval)
		cat >"$work/peat.yaml" <<YAML
streams:
  - name: default
    filters: ["#"]
    durability: ${name#peat-}
YAML
		$pin_broker "$work/peat" serve --config "$work/peat.yaml" --data "$data" \
			--mqtt 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 1)) >"$work/$name.log" 2>&1 &
		;;
	esac
	PID=$!
	for _ in $(seq 100); do
		(exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0
		sleep 0.1
	done
	echo "$name did not start:" >&2; cat "$work/$name.log" >&2; exit 1
}

run() { # name workload-flags...
	local name=$1; shift
	start_system "$name"
	local line
	line=$($pin_load "$work/peat-bench" fanin --addr 127.0.0.1:$PORT --pid "$PID" --label "$name" "$@")
	echo "$line"
	echo "$rep $line" >>"$work/results.txt"
	kill "$PID"; wait "$PID" 2>/dev/null || true
}

systems=(mochi peat-fsync peat-interval)
for rep in $(seq "$REPS"); do
	order=("${systems[@]}")
	[ $((rep % 2)) -eq 0 ] && order=(peat-interval peat-fsync mochi)
	for s in "${order[@]}"; do
		run "$s" --qos 1 --window "$WINDOW" --publishers "$PUBS" --payload "$PAYLOAD" --count "$COUNT" 
		run "$s" --qos 0 --publishers "$PUBS" --payload "$PAYLOAD" --count "$COUNT" --rate "$QOS0_RATE" 
	done
done

go run ./scripts/benchtable <"$work/results.txt"
