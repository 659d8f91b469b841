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

SENSORS=${SENSORS:-1000}
RATE=${RATE:-1}               # msg/s per sensor
QOS=${QOS:-1}
PAYLOAD=${PAYLOAD:-32}
DURATION=${DURATION:-30s}     # publishing phase
IDLE=${IDLE:-3}               # seconds between start and the idle RSS reading
SYSTEMS=${SYSTEMS:-"peat-pi-zero peat-pi mochi mosquitto"}
PEAT_ENV=${PEAT_ENV:-}         # e.g. GOMEMLIMIT=... or GODEBUG=... for the Peat runs

work=$(mktemp -d)
PID=""
cleanup() {
	if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
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

mosquitto_bin=$(command -v mosquitto || true)
[ -z "$mosquitto_bin" ] && [ -x /usr/sbin/mosquitto ] && mosquitto_bin=/usr/sbin/mosquitto
if [ -z "$mosquitto_bin" ] && [[ " $SYSTEMS " == *" mosquitto "* ]]; then
	echo "bench-memory: installing mosquitto" >&2
	sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
	$sudo apt-get update -qq >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >&2
	mosquitto_bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)
fi

CGO_ENABLED=0 go build -o "$work/peat" ./cmd/peat
CGO_ENABLED=0 go build -o "$work/peat-bench" ./cmd/peat-bench
pin_broker="taskset -c 0"; pin_load="taskset -c 1"
command -v taskset >/dev/null || { pin_broker=""; pin_load=""; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Other programs may hold ports on a shared machine: take a fresh pair of
# free ports (MQTT, HTTP) for each run.
pick_port() { # -> sets PORT
	for _ in $(seq 50); do
		PORT=$((20000 + RANDOM % 12000)) # below the usual ephemeral range (32768+): 1,000 sensors take ports there
		port_free "$PORT" && port_free $((PORT + 1)) && return 0
	done
	echo "bench-memory: no free port found" >&2; exit 1
}

start_once() { # name -> sets PID and PORT; fails if the broker exits
	local name=$1
	pick_port
	case $name in
	peat-*)
		# shellcheck disable=SC2086 # PEAT_ENV is a list of NAME=value words
		env $PEAT_ENV $pin_broker "$work/peat" serve --data "$work/data-$name" --profile "${name#peat-}" \
			--mqtt 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 1)) >"$work/$name.log" 2>&1 &
		;;
	mochi) $pin_broker "$work/peat-bench" mochi --listen 127.0.0.1:$PORT >"$work/$name.log" 2>&1 & ;;
	mosquitto)
		cat >"$work/mosquitto.conf" <<CONF
listener $PORT 127.0.0.1
allow_anonymous true
persistence false
max_connections -1
log_dest stderr
log_type error
log_type warning
CONF
		$pin_broker "$mosquitto_bin" -c "$work/mosquitto.conf" >"$work/$name.log" 2>&1 &
		;;
	*) echo "bench-memory: unknown system $name" >&2; exit 2 ;;
	esac
	PID=$!
	for _ in $(seq 100); do
		kill -0 "$PID" 2>/dev/null || break
		port_free "$PORT" || return 0
		sleep 0.1
	done
	kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true
	PID=""
	return 1
}

# A port that looked free may be taken in between: try a few fresh ones.
start_system() { # name -> sets PID and PORT
	for _ in 1 2 3; do
		start_once "$1" && return 0
	done
	echo "$1 did not start:" >&2; cat "$work/$1.log" >&2; exit 1
}

for name in $SYSTEMS; do
	start_system "$name"
	sleep "$IDLE"
	label=$name
	[[ $name == peat-* && -n $PEAT_ENV ]] && label="$name $PEAT_ENV"
	line=$($pin_load "$work/peat-bench" sensors --addr 127.0.0.1:$PORT --pid "$PID" --label "$label" \
		--connections "$SENSORS" --rate "$RATE" --qos "$QOS" --payload "$PAYLOAD" --duration "$DURATION")
	echo "$line"
	echo "$line" >>"$work/results.jsonl"
	kill "$PID"; wait "$PID" 2>/dev/null || true
	PID=""
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
