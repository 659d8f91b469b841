# Sourced by the benchmark scripts: builds the binaries and starts each
# system under test as a fresh process on a fresh loopback port pair, pinned
# to CPU 0 (the load goes on CPU 1). The caller sets $work (a temporary
# directory) and may set PEAT_ENV (environment for Peat runs only).
#
# Systems:
#   peat-fsync, peat-interval   Peat, server profile, that stream durability
#   peat-pi-zero, peat-pi, peat-server   Peat with that storage profile
#   mochi                       plain mochi (peat-bench mochi): allow-all, no persistence
#   mosquitto                   Debian's Mosquitto, persistence off, default queues
#   mosquitto-unlimited         the same with max_queued_messages 0 (no QoS 1 drops)

pin_broker="taskset -c 0"
pin_load="taskset -c 1"
command -v taskset >/dev/null || { pin_broker=""; pin_load=""; }
PID=""
PEAT_ENV=${PEAT_ENV:-}

# bench_build builds peat and peat-bench into $work.
bench_build() {
	CGO_ENABLED=0 go build -o "$work/peat" ./cmd/peat
	CGO_ENABLED=0 go build -o "$work/peat-bench" ./cmd/peat-bench
}

# bench_need_mosquitto installs Debian's mosquitto when one of the systems
# named in "$@" needs it and it is missing; sets mosquitto_bin.
bench_need_mosquitto() {
	mosquitto_bin=$(command -v mosquitto || true)
	[ -z "$mosquitto_bin" ] && [ -x /usr/sbin/mosquitto ] && mosquitto_bin=/usr/sbin/mosquitto
	[[ " $* " == *" mosquitto"* ]] || return 0
	if [ -z "$mosquitto_bin" ]; then
		echo "installing mosquitto" >&2
		local sudo=""
		[ "$(id -u)" -ne 0 ] && sudo="sudo"
		$sudo apt-get update -qq >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >&2
		mosquitto_bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)
	fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pick_port sets PORT to a free port whose successor is free too (MQTT, HTTP),
# below the usual ephemeral range (32768+), where many client sockets go.
pick_port() {
	for _ in $(seq 50); do
		PORT=$((20000 + RANDOM % 12000))
		port_free "$PORT" && port_free $((PORT + 1)) && return 0
	done
	echo "no free port found" >&2
	exit 1
}

# start_once name: starts it on a fresh port; sets PID and PORT; fails if the
# broker exits before it listens.
start_once() {
	local name=$1
	pick_port
	case $name in
	peat-fsync | peat-interval)
		printf 'streams:\n  - name: default\n    filters: ["#"]\n    durability: %s\n' "${name#peat-}" >"$work/$name.yaml"
		# shellcheck disable=SC2086 # PEAT_ENV is a list of NAME=value words
		env $PEAT_ENV $pin_broker "$work/peat" serve --config "$work/$name.yaml" --data "$work/data-$name-$RANDOM" \
			--profile server --mqtt 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 1)) >"$work/$name.log" 2>&1 &
		;;
	peat-*)
		# shellcheck disable=SC2086
		env $PEAT_ENV $pin_broker "$work/peat" serve --data "$work/data-$name-$RANDOM" --profile "${name#peat-}" \
			--mqtt 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 1)) >"$work/$name.log" 2>&1 &
		;;
	mochi) $pin_broker "$work/peat-bench" mochi --listen 127.0.0.1:$PORT >"$work/$name.log" 2>&1 & ;;
	mosquitto | mosquitto-unlimited)
		{
			printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_connections -1\n' "$PORT"
			printf 'log_dest stderr\nlog_type error\nlog_type warning\n'
			[ "$name" = mosquitto-unlimited ] && printf 'max_queued_messages 0\n'
		} >"$work/$name.conf"
		$pin_broker "$mosquitto_bin" -c "$work/$name.conf" >"$work/$name.log" 2>&1 &
		;;
	*) echo "unknown system $name" >&2; exit 2 ;;
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

# start_system name: start_once, retried on fresh ports (a port that looked
# free may be taken in between).
start_system() {
	for _ in 1 2 3; do
		start_once "$1" && return 0
	done
	echo "$1 did not start:" >&2
	cat "$work/$1.log" >&2
	exit 1
}

# stop_system stops the system started last.
stop_system() {
	if [ -n "$PID" ]; then
		kill "$PID" 2>/dev/null || true
		wait "$PID" 2>/dev/null || true
	fi
	PID=""
}

# start_peat_on data profile window durability log: Peat on data (kept
# between runs, for replays) on a fresh port pair, with mqtt.window and
# mqtt.send_window at least window (the defaults would cap a consumer's
# larger Receive Maximum),
# and storage.mapped_limit from MAPPED_LIMIT when set; sets PID and PORT,
# or prints the log and exits.
start_peat_on() {
	local data=$1 profile=$2 window=$3 durability=$4 log=$5
	printf 'mqtt:\n  window: %s\n  send_window: %s\nstreams:\n  - name: default\n    filters: ["#"]\n    durability: %s\n' \
		"$((window > 64 ? window : 64))" "$((window > 256 ? window : 256))" "$durability" >"$log.yaml"
	if [ -n "${MAPPED_LIMIT:-}" ]; then printf 'storage: {mapped_limit: %s}\n' "$MAPPED_LIMIT" >>"$log.yaml"; fi
	for _ in 1 2 3; do
		pick_port
		$pin_broker "$work/peat" serve --config "$log.yaml" --data "$data" --profile "$profile" \
			--mqtt "127.0.0.1:$PORT" --http "127.0.0.1:$((PORT + 1))" >"$log" 2>&1 &
		PID=$!
		for _ in $(seq 300); do
			kill -0 "$PID" 2>/dev/null || break
			port_free "$PORT" || return 0
			sleep 0.1
		done
		stop_system
	done
	echo "peat ($profile) did not start on $data:" >&2
	cat "$log" >&2
	exit 1
}
