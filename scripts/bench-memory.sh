#!/usr/bin/env bash
# Memory benchmark (issue 5, W6): the broker's RSS idle and with many
# low-rate QoS 1 sensors, for Peat (pi-zero and pi profiles) beside plain
# mochi and Debian's Mosquitto (persistence off). Each system is a fresh
# process, pinned to CPU 0 with the load on CPU 1. For each it reports the
# RSS after IDLE seconds, RSS with all sensors connected, RSS at the end of
# the publishing phase, the kernel's peak (VmHWM) and the broker's CPU time
# per acknowledged message, then prints a markdown table.
#
#   scripts/bench-memory.sh                      # 1,000 sensors, 1 msg/s, QoS 1, 30 s
#   SENSORS=2000 DURATION=60s scripts/bench-memory.sh
#   SYSTEMS="peat-pi-zero mosquitto" scripts/bench-memory.sh
#   PEAT_ENV="GODEBUG=gcshrinkstackoff=1" scripts/bench-memory.sh   # environment for Peat only
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

SENSORS=${SENSORS:-1000}
RATE=${RATE:-1}               # msg/s per sensor
QOS=${QOS:-1}
PAYLOAD=${PAYLOAD:-32}
DURATION=${DURATION:-30s}     # publishing phase
IDLE=${IDLE:-3}               # seconds between start and the idle RSS reading
SYSTEMS=${SYSTEMS:-"peat-pi-zero peat-pi mochi mosquitto"}
PEAT_ENV=${PEAT_ENV:-}         # e.g. GOMEMLIMIT=... or GODEBUG=... for the Peat runs

work=$(mktemp -d)
cleanup() {
	stop_system
	rm -rf "$work"
}
trap cleanup EXIT

# Every sensor is one socket in the broker and one in the load generator.
need=$((SENSORS + 1024))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
	ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
	if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
		echo "bench-memory: open file limit $(ulimit -n) is below the $need that $SENSORS sensors need (raise the hard limit)" >&2
		exit 1
	fi
fi

bench_need_mosquitto $SYSTEMS
bench_build

for name in $SYSTEMS; do
	start_system "$name"
	sleep "$IDLE"
	label=$name
	[[ $name == peat-* && -n $PEAT_ENV ]] && label="$name $PEAT_ENV"
	line=$($pin_load "$work/peat-bench" sensors --addr 127.0.0.1:$PORT --pid "$PID" --label "$label" \
		--connections "$SENSORS" --rate "$RATE" --qos "$QOS" --payload "$PAYLOAD" --duration "$DURATION")
	echo "$line"
	echo "$line" >>"$work/results.jsonl"
	stop_system
done

# A flat JSON object per line; pick fields by name.
awk -v sensors="$SENSORS" -v rate="$RATE" -v qos="$QOS" -v dur="$DURATION" '
function field(k,   m) {
	if (match($0, "\"" k "\":(\"[^\"]*\"|[^,}]*)")) {
		m = substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3)
		gsub(/"/, "", m)
		return m
	}
	return "-"
}
{
	n++
	label[n] = field("label"); idle[n] = field("rss_idle_mb"); conn[n] = field("rss_connected_mb")
	end[n] = field("rss_end_mb"); hwm[n] = field("rss_peak_mb"); cpu[n] = field("cpu_us_per_msg")
	acked[n] = field("acked"); sent[n] = field("sent"); errs[n] = field("errors"); p99[n] = field("puback_p99_ms")
	if (label[n] == "mochi") base = n
}
END {
	printf "\n%s sensors, %s msg/s each, QoS %s, %s publishing; RSS in MB\n\n", sensors, rate, qos, dur
	print "| system | idle RSS | RSS connected | RSS under load | VmHWM | load RSS / mochi | CPU us/msg | acked/sent | errors | PUBACK p99 ms |"
	print "|---|---|---|---|---|---|---|---|---|---|"
	for (i = 1; i <= n; i++) {
		ratio = (base && end[base] > 0) ? sprintf("%.2f", end[i] / end[base]) : "-"
		printf "| %s | %s | %s | %s | %s | %s | %s | %s/%s | %s | %s |\n", label[i], idle[i], conn[i], end[i], hwm[i], ratio, cpu[i], acked[i], sent[i], errs[i], p99[i]
	}
}' "$work/results.jsonl"
