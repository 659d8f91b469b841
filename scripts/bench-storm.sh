#!/usr/bin/env bash
# Reconnect storm (issue 21): CLIENTS sensors, each with its own argon2id
# password in auth.users_file, connect at once, ROUNDS times in a row (the
# first round meets a cold verification cache, the next ones a warm one),
# while WATCHERS clients that stayed connected send a PINGREQ every PING.
# Prints one JSON line per profile (peat-bench storm) and a markdown table:
# how long until every sensor had its CONNACK, and the watchers' PINGRESP
# p50/p99/max meanwhile, beside their p99 before the storm. Peat is pinned
# to CPU 0 and the load to CPU 1, loopback only. Writing the users file
# hashes CLIENTS+WATCHERS passwords once (about 15 ms each on x86).
#
#   scripts/bench-storm.sh
#   CLIENTS=300 PROFILES=pi-zero MAX_HASHES=1 scripts/bench-storm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

PROFILES=${PROFILES:-"pi-zero server"}
CLIENTS=${CLIENTS:-1000}
WATCHERS=${WATCHERS:-10}
ROUNDS=${ROUNDS:-2}
PING=${PING:-20ms}
MAX_HASHES=${MAX_HASHES:-0} # auth.max_concurrent_hashes; 0: one less than the CPUs

work=$(mktemp -d)
cleanup() {
	stop_system
	rm -rf "$work"
}
trap cleanup EXIT

need=$((CLIENTS + WATCHERS + 1024))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
	ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fi

bench_build
"$work/peat-bench" storm-users -file "$work/users" -n $((CLIENTS + WATCHERS))
printf 'auth:\n  users_file: %s\n  max_concurrent_hashes: %s\n' "$work/users" "$MAX_HASHES" >"$work/storm.yaml"

echo "| profile | round | all connected (s) | attempts refused (retried) | never connected | ping p50 / p99 / max (ms) | p99 before (ms) |"
echo "|---|---|---|---|---|---|---|"
for profile in $PROFILES; do
	for _ in 1 2 3; do
		pick_port
		$pin_broker "$work/peat" serve --config "$work/storm.yaml" --data "$work/data-$profile-$RANDOM" \
			--profile "$profile" --mqtt 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 1)) >"$work/$profile.log" 2>&1 &
		PID=$!
		for _ in $(seq 100); do
			kill -0 "$PID" 2>/dev/null || break
			port_free "$PORT" || break
			sleep 0.1
		done
		port_free "$PORT" || break
		stop_system
	done
	[ -n "$PID" ] || { cat "$work/$profile.log" >&2; exit 1; }
	$pin_load "$work/peat-bench" storm --addr 127.0.0.1:$PORT --clients "$CLIENTS" --watchers "$WATCHERS" \
		--rounds "$ROUNDS" --ping "$PING" --pid "$PID" --label "peat-$profile" | tee "$work/$profile.json" >&2
	stop_system
	python3 - "$work/$profile.json" "$profile" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for i, x in enumerate(r["rounds"]):
    print(f"| {sys.argv[2]} | {i + 1} | {x['connect_all_s']} | {x['refused']} | {x.get('unconnected', 0)} | "
          f"{x['ping_p50_ms']} / {x['ping_p99_ms']} / {x['ping_max_ms']} | {r['baseline_ping_p99_ms']} |")
PY
done
