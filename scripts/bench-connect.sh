#!/usr/bin/env bash
# Pre-CONNECT benchmark (issue 17, item 7): the broker's RSS idle, with
# SILENT connections that never send a byte, and with BIG connections that
# each announce a BIG_SIZE CONNECT and send 10 bytes; and how many of each
# the broker still holds open HOLD seconds after they connected. It runs
# the Peat of this tree and the Peat of BASE (built from a temporary git
# worktree), each a fresh process per storage profile, pinned to CPU 0 with
# the load on CPU 1, loopback only, and prints a markdown table. About 25 s
# per run.
#
#   scripts/bench-connect.sh                     # this tree vs b618b63, profiles server and pi-zero
#   BASE=HEAD~3 PROFILES=pi-zero scripts/bench-connect.sh
#   SILENT=2000 BIG=100 HOLD=10s scripts/bench-connect.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

BASE=${BASE:-b618b63}
PROFILES=${PROFILES:-"server pi-zero"}
SILENT=${SILENT:-5000}
BIG=${BIG:-300}
BIG_SIZE=${BIG_SIZE:-1048576}
SETTLE=${SETTLE:-2s}   # after a batch is open, before reading RSS (below the default connect_timeout)
HOLD=${HOLD:-8s}       # after a batch is open, before counting what is still open
IDLE=${IDLE:-2}        # seconds between start and the idle RSS reading

work=$(mktemp -d)
base_tree="$work/base-tree"
cleanup() {
	stop_system
	git worktree remove --force "$base_tree" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

need=$((SILENT + BIG + 1024))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
	ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
	if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
		echo "bench-connect: open file limit $(ulimit -n) is below the $need this needs" >&2
		exit 1
	fi
fi

head=$(git rev-parse --short HEAD)
base=$(git rev-parse --short "$BASE")
bench_build # peat (this tree) and peat-bench into $work
mv "$work/peat" "$work/peat-$head"
git worktree add --detach --quiet "$base_tree" "$base"
(cd "$base_tree" && CGO_ENABLED=0 go build -o "$work/peat-$base" ./cmd/peat)

for profile in $PROFILES; do
	for rev in "$base" "$head"; do
		cp "$work/peat-$rev" "$work/peat"
		start_system "peat-$profile"
		sleep "$IDLE"
		line=$($pin_load "$work/peat-bench" connect --addr 127.0.0.1:$PORT --pid "$PID" --label "$rev $profile" \
			--metrics "http://127.0.0.1:$((PORT + 1))/metrics" --silent "$SILENT" --big "$BIG" --big-size "$BIG_SIZE" --settle "$SETTLE" --hold "$HOLD")
		echo "$line"
		echo "$line" >>"$work/results.jsonl"
		stop_system
	done
done

awk -v silent="$SILENT" -v big="$BIG" -v size="$BIG_SIZE" -v hold="$HOLD" -v settle="$SETTLE" '
function field(k,   m) {
	if (match($0, "\"" k "\":(\"[^\"]*\"|[^,}]*)")) {
		m = substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3)
		gsub(/"/, "", m)
		return m
	}
	return "-"
}
BEGIN {
	printf "\n%s silent connections, then %s connections announcing a %s-byte CONNECT and sending 10 bytes;\n", silent, big, size
	printf "RSS and Go heap in use in MB, %s after each batch opened; \"open\" = connections the broker still held %s after they opened\n\n", settle, hold
	print "| Peat | profile | idle RSS (heap) | RSS (heap) silent | silent open | RSS (heap) big CONNECT | big open | VmHWM |"
	print "|---|---|---|---|---|---|---|---|"
}
{
	split(field("label"), lp, " ")
	printf "| %s | %s | %.1f (%.1f) | %.1f (%.1f) | %s / %s | %.1f (%.1f) | %s / %s | %.1f |\n", lp[1], lp[2],
		field("rss_idle_mb"), field("heap_idle_mb"), field("rss_silent_mb"), field("heap_silent_mb"),
		field("silent_open_after_hold"), field("silent_opened"), field("rss_big_mb"), field("heap_big_mb"),
		field("big_open_after_hold"), field("big_opened"), field("rss_peak_mb")
}
END { print "" }' "$work/results.jsonl"
# What this tree closed, and why (peat_mqtt_closed_connections_total).
grep -o '"label":"[^"]*"\|"closed":{[^}]*}' "$work/results.jsonl" | paste -d' ' - - | sed 's/"label"://; s/"closed"://'

