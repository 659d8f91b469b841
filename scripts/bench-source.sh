#!/usr/bin/env bash
# Cloud to edge (issue 35): a backlog of COUNT QoS 1 messages waits in the
# cloud (a Mosquitto) for an edge's durable session, then the edge starts
# and drains it. Two edges, each a fresh process pinned to CPU 0:
#
#   peat       Peat (PROFILE, default server; the stream's default
#              durability, fsync) with an MQTT source subscribed to `#`
#              at QoS 1: each message acknowledged upstream once durable,
#              RECEIVE_MAX (default 64, the source's default) in flight
#   mosquitto  Debian's Mosquitto bridging `topic # in 1` (cleansession
#              false, persistence off, max_queued_messages 0)
#
# The session is made in the cloud first (mosquitto_sub with the edge's
# client id and clean session off), the backlog is published into it by
# peat-bench fanin (10 publishers, QoS 1, PAYLOAD bytes), and only then
# does the edge start. Reported per edge: the drain time and rate (from
# the edge's start to its COUNT-th message: Peat's
# peat_source_appended_records_total, polled every 100 ms; Mosquitto's
# $SYS/broker/publish/messages/received, published every second, so its
# times are up to a second long), the edge's CPU per message drained, and
# its RSS idle before the drain and at its peak. Loopback only; REPS
# repetitions.
#
#   scripts/bench-source.sh                 # COUNT=1000000, peat and mosquitto
#   COUNT=200000 EDGES=peat scripts/bench-source.sh
#   RECEIVE_MAX=512 EDGES=peat scripts/bench-source.sh   # a wider window
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

COUNT=${COUNT:-1000000}
REPS=${REPS:-1}
read -r -a edges <<<"${EDGES:-peat mosquitto}"
PUBS=10
PAYLOAD=${PAYLOAD:-64}
DRAIN_LIMIT=${DRAIN_LIMIT:-900} # seconds a drain may take before the run fails
PROFILE=${PROFILE:-server}
RECEIVE_MAX=${RECEIVE_MAX:-64} # the source's receive_maximum (its default)

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
	echo "bench-source: mosquitto_sub missing (Debian: apt-get install mosquitto-clients)" >&2
	exit 1
}
bench_build
tick=$(getconf CLK_TCK)
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
cpu_ticks() { awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }

# cloud_start: the cloud Mosquitto on UP_PORT; it keeps the backlog in memory.
cloud_start() {
	printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 0\nlog_dest stderr\nlog_type error\n' \
		"$UP_PORT" >"$work/up.conf"
	$pin_load "$mosquitto_bin" -c "$work/up.conf" >>"$work/up.log" 2>&1 &
	UP_PID=$!
	for _ in $(seq 100); do port_free "$UP_PORT" || return 0; sleep 0.05; done
	echo "cloud mosquitto did not start" >&2; cat "$work/up.log" >&2; exit 1
}

# edge_start name: the edge on EDGE_PORT, pulling from UP_PORT.
edge_start() {
	case $1 in
	peat)
		cat >"$work/edge.yaml" <<-EOF
			sources:
			  - name: cloud
			    backoff: {min: 100ms, max: 500ms}
			    mqtt:
			      url: mqtt://127.0.0.1:$UP_PORT
			      client_id: edge-peat
			      receive_maximum: $RECEIVE_MAX
			      subscribe: [{filter: "#", qos: 1}]
		EOF
		$pin_broker "$work/peat" serve --config "$work/edge.yaml" --data "$work/edge-data-$RANDOM" --profile "$PROFILE" \
			--mqtt "127.0.0.1:$EDGE_PORT" --http "127.0.0.1:$((EDGE_PORT + 1))" >"$work/edge.log" 2>&1 &
		;;
	mosquitto)
		printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 0\nsys_interval 1\nlog_dest stderr\nlog_type error\n' "$EDGE_PORT" >"$work/edge.conf"
		printf 'connection cloud\naddress 127.0.0.1:%s\ntopic # in 1\ncleansession false\nclientid edge-mosquitto\nrestart_timeout 1\n' "$UP_PORT" >>"$work/edge.conf"
		$pin_broker "$mosquitto_bin" -c "$work/edge.conf" >"$work/edge.log" 2>&1 &
		;;
	esac
	EDGE_PID=$!
}

# drained name: how many messages the edge has taken in.
drained() {
	case $1 in
	peat)
		curl -s "http://127.0.0.1:$((EDGE_PORT + 1))/metrics" 2>/dev/null |
			awk '/^peat_source_appended_records_total\{source="cloud"\}/ {printf "%d", $2; f = 1} END {if (!f) print 0}'
		;;
	mosquitto)
		timeout 3 mosquitto_sub -p "$EDGE_PORT" -t '$SYS/broker/publish/messages/received' -C 1 2>/dev/null || echo 0
		;;
	esac
}

echo "| edge | messages | drain s | drained msg/s | edge CPU µs/msg | RSS idle MB | RSS peak MB |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for rep in $(seq "$REPS"); do
	for edge in "${edges[@]}"; do
		rm -f "$work/up.log"
		pick_port
		UP_PORT=$PORT
		cloud_start
		# The edge's durable session in the cloud, then the backlog.
		mosquitto_sub -p "$UP_PORT" -i "edge-$edge" -c -q 1 -t '#' -W 1 >/dev/null 2>&1 || true
		$pin_load "$work/peat-bench" fanin --addr "127.0.0.1:$UP_PORT" --publishers $PUBS --subscribers 0 \
			--qos 1 --payload "$PAYLOAD" --count $((COUNT / PUBS)) --label cloud >"$work/fanin.json"

		pick_port
		EDGE_PORT=$PORT
		t0=$(date +%s.%N)
		edge_start "$edge"
		for _ in $(seq 200); do port_free "$EDGE_PORT" || break; sleep 0.02; done
		idle=$(rss_kb "$EDGE_PID")
		c0=$(cpu_ticks "$EDGE_PID")
		(
			while kill -0 "$EDGE_PID" 2>/dev/null; do rss_kb "$EDGE_PID"; sleep 0.2; done
		) >"$work/rss.txt" &
		SAMPLER=$!
		until [ "$(drained "$edge")" -ge "$COUNT" ]; do
			if [ "$(awk -v t0="$t0" -v t="$(date +%s.%N)" 'BEGIN {print (t - t0 > 0 + '"$DRAIN_LIMIT"')}')" = 1 ]; then
				echo "bench-source: $edge drained $(drained "$edge") of $COUNT within ${DRAIN_LIMIT}s" >&2
				cat "$work/edge.log" >&2
				exit 1
			fi
			sleep 0.1
		done
		t1=$(date +%s.%N)
		c1=$(cpu_ticks "$EDGE_PID")
		kill "$SAMPLER" 2>/dev/null || true
		wait "$SAMPLER" 2>/dev/null || true
		SAMPLER=""
		peak=$(sort -n "$work/rss.txt" | tail -1)
		kill "$EDGE_PID"; wait "$EDGE_PID" 2>/dev/null || true; EDGE_PID=""
		kill "$UP_PID"; wait "$UP_PID" 2>/dev/null || true; UP_PID=""
		awk -v e="$edge" -v n="$COUNT" -v t0="$t0" -v t1="$t1" -v c0="$c0" -v c1="$c1" -v tick="$tick" -v i="$idle" -v k="$peak" 'BEGIN {
			d = t1 - t0
			printf "| %s | %d | %.1f | %.0f | %.1f | %.1f | %.1f |\n", e, n, d, n/d, (c1-c0)/tick*1e6/n, i/1024, k/1024
		}'
	done
done
