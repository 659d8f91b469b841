#!/usr/bin/env bash
# Upstream sync through an outage (issue 20): an edge broker takes COUNT
# QoS 1 records while its upstream is down, then the upstream comes back
# and the backlog drains. Two edges, each a fresh process pinned to CPU 0:
#
#   peat       Peat (PROFILE, default server; DURABILITY, default fsync as
#              Peat's own default) with an MQTT sink to the upstream: the
#              log is the buffer
#   peat-nosink  the same Peat with no sink: its RSS through the pile-up is
#              what the log and storage engine hold, without the sink
#              (no drain)
#   mosquitto  Debian's Mosquitto bridging `#` out at QoS 1 (cleansession
#              false, max_queued_messages 0 so it drops nothing): the
#              backlog is its in-memory bridge queue
#
# The upstream is a second Mosquitto with persistence on and a durable
# subscriber session ("counter"): it is started once to create the
# session, stopped (the outage), and started again after the pile-up, and
# the counter then receives every record. Reported per edge: RSS idle,
# after each of PARTS parts of the pile-up (default 4: quarters), their
# spread once warm (the highest less the lowest after parts 2..PARTS), the
# anonymous and file-backed parts of RSS at the end of the pile-up (heap
# against mapped data files), the peak RSS of the pile-up and of the whole
# run, the drain time and rate (from the upstream's restart to the
# counter's last record), and the edge's CPU per record drained.
# Loopback only; REPS repetitions.
#
#   scripts/bench-sink.sh                  # COUNT=1000000, peat and mosquitto
#   COUNT=200000 EDGES=peat scripts/bench-sink.sh
#   COUNT=2000000 PARTS=8 EDGES="peat peat-nosink" scripts/bench-sink.sh
#   SINK_VERSION=4 scripts/bench-sink.sh    # the sink speaks MQTT 3.1.1, as the bridge does
#   PEAT_BIN=/path/to/peat scripts/bench-sink.sh   # another Peat build
#   DURABILITY=interval scripts/bench-sink.sh      # the stream's durability (default fsync)
#   PUBS=1 WINDOW=1 PIN=0 scripts/bench-sink.sh     # one publisher, one publish in
#                       # flight (batches of one record in the log), nothing pinned
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

COUNT=${COUNT:-1000000}
REPS=${REPS:-1}
PARTS=${PARTS:-4}
read -r -a edges <<<"${EDGES:-peat mosquitto}"
PUBS=${PUBS:-10}     # publishers of the pile-up
WINDOW=${WINDOW:-16} # QoS 1 publishes each keeps in flight
DURABILITY=${DURABILITY:-fsync}
if [ "${PIN:-1}" = 0 ]; then pin_broker="" pin_load=""; fi
PAYLOAD=${PAYLOAD:-64}
DRAIN_LIMIT=${DRAIN_LIMIT:-600} # seconds a drain may take before the run fails
PROFILE=${PROFILE:-server}     # Peat's storage profile
SINK_VERSION=${SINK_VERSION:-5} # MQTT version of Peat's sink (5, the default, or 4; Mosquitto's bridge speaks 4)

work=$(mktemp -d)
UP_PID="" EDGE_PID="" SAMPLER=""
cleanup() {
	for p in $SAMPLER $EDGE_PID $UP_PID; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

bench_need_mosquitto mosquitto
command -v mosquitto_sub >/dev/null || {
	echo "bench-sink: mosquitto_sub missing (Debian: apt-get install mosquitto-clients)" >&2
	exit 1
}
bench_build
if [ -n "${PEAT_BIN:-}" ]; then cp "$PEAT_BIN" "$work/peat"; fi # another build of Peat
tick=$(getconf CLK_TCK)

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# rss_split pid: "anon / file" MB (RssAnon; RssFile and RssShmem).
rss_split() {
	awk '/^RssAnon:/ {a = $2} /^Rss(File|Shmem):/ {f += $2} END {printf "%.1f / %.1f", a/1024, f/1024}' "/proc/$1/status"
}
cpu_ticks() { awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }

# upstream_start: the upstream Mosquitto on UP_PORT, persistence in $work/up.
upstream_start() {
	mkdir -p "$work/up"
	# Mosquitto started as root runs as the user mosquitto: it must reach
	# and write its persistence, or the counter's session (and the records
	# the sink sends before the counter subscribes again) is lost.
	chmod a+x "$work" && chmod a+rwx "$work/up"
	printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location %s/\nmax_queued_messages 0\nmax_inflight_messages 0\nlog_dest stderr\nlog_type error\n' \
		"$UP_PORT" "$work/up" >"$work/up.conf"
	$pin_load "$mosquitto_bin" -c "$work/up.conf" >>"$work/up.log" 2>&1 &
	UP_PID=$!
	for _ in $(seq 100); do port_free "$UP_PORT" || return 0; sleep 0.05; done
	echo "upstream mosquitto did not start" >&2; cat "$work/up.log" >&2; exit 1
}
upstream_stop() { kill "$UP_PID"; wait "$UP_PID" 2>/dev/null || true; UP_PID=""; }

# edge_start name: the edge on EDGE_PORT, forwarding to UP_PORT.
edge_start() {
	case $1 in
	peat | peat-nosink)
		cat >"$work/edge.yaml" <<-EOF
			streams:
			  - name: default
			    filters: ["#"]
			    durability: $DURABILITY
		EOF
		[ "$1" = peat ] && cat >>"$work/edge.yaml" <<-EOF
			sinks:
			  - name: up
			    mqtt:
			      url: mqtt://127.0.0.1:$UP_PORT
			      client_id: edge-peat
			      qos: 1
			      version: $SINK_VERSION
			    backoff: {min: 100ms, max: 500ms}
		EOF
		$pin_broker "$work/peat" serve --config "$work/edge.yaml" --data "$work/edge-data-$RANDOM" --profile "$PROFILE" \
			--mqtt "127.0.0.1:$EDGE_PORT" --http "127.0.0.1:$((EDGE_PORT + 1))" >"$work/edge.log" 2>&1 &
		;;
	mosquitto)
		printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 0\nlog_dest stderr\nlog_type error\n' "$EDGE_PORT" >"$work/edge.conf"
		printf 'connection up\naddress 127.0.0.1:%s\ntopic # out 1\ncleansession false\nclientid edge-mosquitto\nrestart_timeout 1\n' "$UP_PORT" >>"$work/edge.conf"
		$pin_broker "$mosquitto_bin" -c "$work/edge.conf" >"$work/edge.log" 2>&1 &
		;;
	esac
	EDGE_PID=$!
	for _ in $(seq 200); do port_free "$EDGE_PORT" || return 0; sleep 0.05; done
	echo "edge $1 did not start" >&2; cat "$work/edge.log" >&2; exit 1
}

echo "| edge | records | RSS idle MB | RSS after each $((COUNT / PARTS)) records MB | spread after part 1 MB | anon / file MB at the end | pile-up peak MB | RSS peak MB | drain s | drained rec/s | edge CPU µs/rec drained |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for rep in $(seq "$REPS"); do
	for edge in "${edges[@]}"; do
		rm -rf "$work/up" "$work/up.log"
		pick_port
		UP_PORT=$PORT
		upstream_start
		# The counter's durable session: it queues upstream while the counter is away.
		mosquitto_sub -p "$UP_PORT" -i counter -c -q 1 -t '#' -W 1 >/dev/null 2>&1 || true
		upstream_stop # the outage begins

		pick_port
		EDGE_PORT=$PORT
		edge_start "$edge"
		sleep 1
		idle=$(rss_kb "$EDGE_PID")
		peak=$idle
		(
			while kill -0 "$EDGE_PID" 2>/dev/null; do rss_kb "$EDGE_PID"; sleep 0.2; done
		) >"$work/rss.txt" &
		SAMPLER=$!

		# The pile-up in parts, RSS after each: a buffer that lives in
		# memory grows with every part, the log does not.
		quarters=""
		for q in $(seq "$PARTS"); do
			$pin_load "$work/peat-bench" fanin --addr "127.0.0.1:$EDGE_PORT" --publishers $PUBS --window $WINDOW --subscribers 0 \
				--qos 1 --payload "$PAYLOAD" --count $((COUNT / PUBS / PARTS)) --label "$edge" >"$work/fanin.json"
			sleep 1
			quarters="$quarters$(awk -v k="$(rss_kb "$EDGE_PID")" 'BEGIN {printf "%.1f", k/1024}')"
			[ "$q" -lt "$PARTS" ] && quarters="$quarters / "
		done
		split=$(rss_split "$EDGE_PID")
		# How flat the pile-up is once warm: the highest less the lowest
		# RSS after parts 2..PARTS, and the highest sample of the pile-up.
		spread=$(awk -v q="$quarters" 'BEGIN { n = split(q, v, " / "); lo = 1e9; hi = 0
			for (i = 2; i <= n; i++) { if (v[i] < lo) lo = v[i]; if (v[i] > hi) hi = v[i] }
			if (n < 2) print "-"; else printf "%.1f", hi - lo }')
		pile_peak=$(sort -n "$work/rss.txt" | tail -1)
		if [ "$edge" = peat-nosink ]; then # nothing to drain
			kill "$SAMPLER" 2>/dev/null || true
			wait "$SAMPLER" 2>/dev/null || true
			SAMPLER=""
			peak=$(sort -n "$work/rss.txt" | tail -1)
			kill "$EDGE_PID"; wait "$EDGE_PID" 2>/dev/null || true; EDGE_PID=""
			awk -v e="$edge" -v n="$COUNT" -v i="$idle" -v q="$quarters" -v sp="$spread" -v s="$split" -v pp="$pile_peak" -v k="$peak" \
				'BEGIN { printf "| %s | %d | %.1f | %s | %s | %s | %.1f | %.1f | - | - | - |\n", e, n, i/1024, q, sp, s, pp/1024, k/1024 }'
			continue
		fi

		c0=$(cpu_ticks "$EDGE_PID")
		t0=$(date +%s.%N)
		upstream_start # the outage ends
		if ! timeout "$DRAIN_LIMIT" mosquitto_sub -p "$UP_PORT" -i counter -c -q 1 -t '#' -C "$COUNT" >/dev/null; then
			echo "bench-sink: $edge: the upstream did not get $COUNT records within ${DRAIN_LIMIT}s" >&2
			exit 1
		fi
		t1=$(date +%s.%N)
		c1=$(cpu_ticks "$EDGE_PID")
		kill "$SAMPLER" 2>/dev/null || true
		wait "$SAMPLER" 2>/dev/null || true
		SAMPLER=""
		peak=$(sort -n "$work/rss.txt" | tail -1)
		kill "$EDGE_PID"; wait "$EDGE_PID" 2>/dev/null || true; EDGE_PID=""
		upstream_stop

		awk -v e="$edge" -v n="$COUNT" -v i="$idle" -v q="$quarters" -v sp="$spread" -v s="$split" -v pp="$pile_peak" -v k="$peak" -v t0="$t0" -v t1="$t1" \
			-v c0="$c0" -v c1="$c1" -v tick="$tick" 'BEGIN {
			d = t1 - t0
			printf "| %s | %d | %.1f | %s | %s | %s | %.1f | %.1f | %.1f | %.0f | %.1f |\n", e, n, i/1024, q, sp, s, pp/1024, k/1024, d, n/d, (c1-c0)/tick*1e6/n
		}'
	done
done
