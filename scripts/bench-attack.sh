#!/usr/bin/env bash
# Password guessing and silent sockets from one address (issue 31): SENSORS
# sensors at 127.0.0.1 reconnect in a loop with their own argon2id
# passwords (a warm verification cache, as a fleet's reconnects are),
# PHASE long with no attack, then PHASE long while 127.0.0.2 guesses
# sensor-0's password over GUESSERS connections at once and keeps SILENT
# sockets open without sending a CONNECT. Prints one JSON line per system
# (peat-bench attack) and a markdown table: the sensors' connect latency
# in each phase, and the attacker's guesses per second. Each system runs
# three attacks: guess (no silent sockets), silent (no guesses), both.
# BASE, when set (a git ref), runs that Peat too, for the "before". Peat
# is pinned to CPU 0 and the load to CPU 1, loopback only, default config
# but users.
#
#   scripts/bench-attack.sh
#   BASE=main PHASE=10s scripts/bench-attack.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

SENSORS=${SENSORS:-10}
GUESSERS=${GUESSERS:-8}
SILENT=${SILENT:-300}
PHASE=${PHASE:-10s}
BASE=${BASE:-}

work=$(mktemp -d)
cleanup() {
	stop_system
	rm -rf "$work"
}
trap cleanup EXIT

bench_build
systems="peat"
if [ -n "$BASE" ]; then
	mkdir "$work/base"
	git archive "$BASE" | tar -x -C "$work/base"
	(cd "$work/base" && CGO_ENABLED=0 go build -o "$work/peat-base" ./cmd/peat)
	systems="peat-base peat"
fi
RUNS=${RUNS:-}
if [ -z "$RUNS" ]; then
	for system in $systems; do
		RUNS="$RUNS $system:guess $system:silent $system:both"
	done
fi
"$work/peat-bench" storm-users -file "$work/users" -n $((SENSORS + 1))
printf 'auth:\n  users_file: %s\n' "$work/users" >"$work/attack.yaml"

echo "| system | attack | sensors' connect p50 / p99 / max (ms), no attack | under attack | sensors refused under attack | guesses/s | s per 1,000 guesses | silent sockets held |"
echo "|---|---|---|---|---|---|---|---|"
for run in $RUNS; do
	system=${run%%:*}
	attack=${run#*:}
	case $attack in
	guess) guessers=$GUESSERS silent=0 ;;
	silent) guessers=0 silent=$SILENT ;;
	*) guessers=$GUESSERS silent=$SILENT ;;
	esac
	pick_port
	$pin_broker "$work/$system" serve --config "$work/attack.yaml" --data "$work/data-$system" \
		--mqtt 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 1)) >"$work/$system.log" 2>&1 &
	PID=$!
	for _ in $(seq 100); do
		port_free "$PORT" || break
		sleep 0.1
	done
	$pin_load "$work/peat-bench" attack --addr 127.0.0.1:$PORT --sensors "$SENSORS" --guessers "$guessers" \
		--silent "$silent" --phase "$PHASE" --label "$system" | tee "$work/$system.json" >&2
	stop_system
	python3 - "$work/$system.json" "$attack" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b, a = r["baseline"], r["attack"]
print(f"| {r['label']} | {sys.argv[2]} | {b['connect_p50_ms']} / {b['connect_p99_ms']} / {b['connect_max_ms']} | "
      f"{a['connect_p50_ms']} / {a['connect_p99_ms']} / {a['connect_max_ms']} | {a['failed']} of {a['failed'] + a['connects']} | "
      f"{r['guesses_per_s']} | {r['s_per_1000_guesses']} | {r['silent_open_avg']} |")
PY
done
