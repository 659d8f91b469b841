#!/usr/bin/env bash
# Memory and SD-card writes per storage profile (issue 4, items 4 and 5).
# For each profile, two fresh Peat processes, pinned to CPU 0 with the load
# on CPU 1:
#
#  1. ingest: RSS after IDLE seconds; then RECORDS QoS 1 publishes of PAYLOAD
#     bytes from PUBLISHERS connections (WINDOW in flight each, no
#     subscriber), with VmRSS and RssAnon sampled every 0.2 s (peak) and the
#     broker's /proc/<pid>/io write_bytes read before the ingest, at the last
#     PUBACK, once background writes have stopped (compactions; at most
#     SETTLE_MAX s), and at exit after SIGTERM (Badger flushes its memory
#     tables on close; the exit figure comes from the wrapper shell that
#     reaps the broker, which inherits its I/O counters). Bytes per record =
#     write_bytes difference / records in the log.
#  2. clients: CLIENTS connections, each publishing QoS 1 at CLIENT_RATE
#     msg/s for CLIENT_DURATION: RSS connected, RSS at the end, VmHWM, and
#     write_bytes per message (each message is its own small commit here).
#
# write_bytes counts each page a process dirties (Linux counts it when the
# page goes from clean to dirty, so a page rewritten after every fsync
# counts each time); the file system's journal and the card's own
# amplification come on top. Prints two markdown tables.
#
# What a page is depends on the kernel: since Linux 6.16, ext4 caches file
# data in large folios (up to 2 MB), and a commit that touches a clean one
# dirties, and writes back, all of it. Raspberry Pi OS's 6.12 kernel uses
# 4 KB pages. DATA_ROOT puts the data directories on the file system to
# measure (an SD card's, or a loop-mounted ext4 made with `mkfs.ext4 -O
# verity`, which turns large folios off).
#
#   scripts/bench-pi.sh                                  # pi-zero, pi, server; 1M records, 1,000 clients
#   PROFILES=pi-zero RECORDS=200000 CLIENTS=200 scripts/bench-pi.sh
#   PEAT_ENV="GOMEMLIMIT=64MiB" PROFILES=pi-zero scripts/bench-pi.sh
#   DATA_ROOT=/mnt/sd DURABILITY=interval scripts/bench-pi.sh
#   PEAT_BIN=dist/peat-linux-amd64 scripts/bench-pi.sh
#   MEMORY_MAX=128M PROFILES=pi-zero scripts/bench-pi.sh   # a small board: see below
#   CLIENTS=0 PROFILES="pi-zero pi" scripts/bench-pi.sh      # the ingest only
#   MAX_BYTES=64MiB CLIENTS=0 scripts/bench-pi.sh          # with retention giving space back during the ingest
#
# RSS counts the pages of Badger's memory-mapped files that the broker has
# touched: page cache, which the kernel takes back when memory is short,
# and which grows with the log on a machine with memory to spare.
# MEMORY_MAX runs the broker in a memory cgroup of that size (as root;
# cgroup v2, or v1's memory controller), where its heap and its page cache
# share the budget as on a small board: the tables then add the cgroup's
# peak usage and whether the kernel had to kill the broker.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-brokers.sh
. scripts/lib-brokers.sh

PROFILES=${PROFILES:-"pi-zero pi server"}
RECORDS=${RECORDS:-1000000}
PUBLISHERS=${PUBLISHERS:-10}
WINDOW=${WINDOW:-16}
PAYLOAD=${PAYLOAD:-128}
CLIENTS=${CLIENTS:-1000}
CLIENT_RATE=${CLIENT_RATE:-1}
CLIENT_DURATION=${CLIENT_DURATION:-30s}
IDLE=${IDLE:-3}
SETTLE_MAX=${SETTLE_MAX:-60}
PEAT_ENV=${PEAT_ENV:-}
DATA_ROOT=${DATA_ROOT:-}         # where the data directories go (default: the temporary directory)
DURABILITY=${DURABILITY:-fsync} # of the stream: fsync or interval
PEAT_BIN=${PEAT_BIN:-}           # a peat binary to measure instead of one built from this tree
MEMORY_MAX=${MEMORY_MAX:-}       # e.g. 128M: run the broker in a memory cgroup of that size
MAX_BYTES=${MAX_BYTES:-}         # e.g. 64MiB: the stream's max_bytes (disk bytes/rec is then of the records kept)
LINGER=${LINGER:-}               # e.g. 5ms: the stream's linger (lone publishes share a commit)
MAPPED_LIMIT=${MAPPED_LIMIT:-}   # storage.mapped_limit (-1: let Badger's mapped pages stay in RSS)

work=$(mktemp -d)
data_root=${DATA_ROOT:-$work}
mkdir -p "$data_root"
data_root=$(cd "$data_root" && pwd)
printf 'streams:\n  - name: default\n    filters: ["#"]\n    durability: %s\n' "$DURABILITY" >"$work/peat.yaml"
[ -n "$LINGER" ] && printf '    linger: %s\n' "$LINGER" >>"$work/peat.yaml"
storage_opts=""
if [ -n "$MAX_BYTES" ]; then # size retention, applied every 5 s, reclaimed every 15 s: the steady state of a full log
	printf '    retention: {max_bytes: %s}\n' "$MAX_BYTES" >>"$work/peat.yaml"
	storage_opts="retention_interval: 5s, reclaim_interval: 15s"
fi
[ -n "$MAPPED_LIMIT" ] && storage_opts="${storage_opts:+$storage_opts, }mapped_limit: $MAPPED_LIMIT"
[ -n "$storage_opts" ] && printf 'storage: {%s}\n' "$storage_opts" >>"$work/peat.yaml"

# A memory cgroup for the broker, when MEMORY_MAX is set. cg_peak and
# cg_ooms read it; each start_peat empties it first.
cgroup=""
if [ -n "$MEMORY_MAX" ]; then
	if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
		cgroup=/sys/fs/cgroup/peat-bench-pi-$$
		mkdir "$cgroup"
		echo "$MEMORY_MAX" >"$cgroup/memory.max"
		echo 0 >"$cgroup/memory.swap.max" 2>/dev/null || true
	elif [ -d /sys/fs/cgroup/memory ]; then
		cgroup=/sys/fs/cgroup/memory/peat-bench-pi-$$
		mkdir "$cgroup"
		echo "$MEMORY_MAX" >"$cgroup/memory.limit_in_bytes"
	fi
	if [ -z "$cgroup" ]; then
		echo "bench-pi: MEMORY_MAX needs a memory cgroup (cgroup v2, or v1's memory controller)" >&2
		exit 1
	fi
fi
cg_reset() {
	[ -n "$cgroup" ] || return 0
	if [ -f "$cgroup/memory.peak" ]; then echo reset >"$cgroup/memory.peak" 2>/dev/null || true; fi
	if [ -f "$cgroup/memory.max_usage_in_bytes" ]; then echo 0 >"$cgroup/memory.max_usage_in_bytes"; fi
	return 0
}
cg_peak() { # MB
	local b="-"
	if [ -f "$cgroup/memory.peak" ]; then b=$(cat "$cgroup/memory.peak"); elif [ -f "$cgroup/memory.max_usage_in_bytes" ]; then b=$(cat "$cgroup/memory.max_usage_in_bytes"); fi
	if [ "$b" = - ]; then echo -; else mb "$b"; fi
}
cg_ooms() {
	if [ -f "$cgroup/memory.events" ]; then awk '$1 == "oom_kill" { print $2 }' "$cgroup/memory.events"
	elif [ -f "$cgroup/memory.oom_control" ]; then awk '$1 == "oom_kill" { print $2 }' "$cgroup/memory.oom_control"
	else echo -; fi
}
WRAPPER=""
cleanup() {
	[ -n "${SAMPLER:-}" ] && kill "$SAMPLER" 2>/dev/null
	stop_peat
	rm -rf "$work" "$data_root"/peat-bench-pi-$$-*
	if [ -n "$cgroup" ]; then rmdir "$cgroup" 2>/dev/null || true; fi
}
trap cleanup EXIT

need=$((CLIENTS + 1024))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
	ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
	if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
		echo "bench-pi: open file limit $(ulimit -n) is below the $need that $CLIENTS clients need" >&2
		exit 1
	fi
fi
command -v curl >/dev/null || { echo "bench-pi: needs curl" >&2; exit 1; }

# start_peat profile tag: a fresh Peat with that profile under a wrapper
# shell that, once the broker has exited, writes the broker's lifetime I/O
# counters to $work/<tag>.io. Sets PID, PORT, WRAPPER, DATA.
start_peat() {
	local profile=$1 tag=$2
	DATA=$data_root/peat-bench-pi-$$-$tag
	cg_reset
	for _ in 1 2 3; do
		pick_port
		rm -f "$work/$tag.pid" "$work/$tag.io"
		# shellcheck disable=SC2016,SC2086 # expanded by the wrapper; PEAT_ENV is NAME=value words
		bash -c '[ -z "$3" ] || echo $$ >"$3/cgroup.procs"; env "${@:4}" & echo $! >"$1"; wait $!; rc=$?; cat /proc/$$/io >"$2"; exit $rc' wrapper \
			"$work/$tag.pid" "$work/$tag.io" "$cgroup" $PEAT_ENV $pin_broker "$work/peat" serve --config "$work/peat.yaml" --data "$DATA" --profile "$profile" \
			--mqtt 127.0.0.1:"$PORT" --http 127.0.0.1:$((PORT + 1)) >"$work/$tag.log" 2>&1 &
		WRAPPER=$!
		for _ in $(seq 100); do
			[ -s "$work/$tag.pid" ] && break
			sleep 0.05
		done
		PID=$(cat "$work/$tag.pid" 2>/dev/null || true)
		for _ in $(seq 100); do
			kill -0 "$WRAPPER" 2>/dev/null || break
			if ! port_free "$PORT" && ! port_free $((PORT + 1)); then
				return 0
			fi
			sleep 0.1
		done
		stop_peat
	done
	echo "bench-pi: peat --profile $profile did not start:" >&2
	cat "$work/$tag.log" >&2
	exit 1
}

# stop_peat sends SIGTERM to the broker and waits for the wrapper.
stop_peat() {
	if [ -n "$WRAPPER" ]; then
		if [ -n "${PID:-}" ]; then kill "$PID" 2>/dev/null || true; fi
		wait "$WRAPPER" 2>/dev/null || true
	fi
	WRAPPER="" PID=""
}

kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
wbytes() { awk '$1 == "write_bytes:" { print $2 }' "$1"; }
mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f", a / b; else print "-" }'; }
json() { sed -n "s/.*\"$1\":\\([^,}]*\\).*/\\1/p" <<<"$2" | tr -d '"'; }
metric() { curl -s "http://127.0.0.1:$((PORT + 1))/metrics" | awk -v m="$1" '$1 == m { printf "%.1f", $2 / 1048576 }'; }
stream() { curl -s "http://127.0.0.1:$((PORT + 1))/api/v1/streams/default" | tr -d ' \n' | sed -n "s/.*\"$1\":\\([0-9]*\\).*/\\1/p"; }

# sample pid file: every 0.2 s, keeps the highest VmRSS and RssAnon (kB)
# seen in file, until killed.
sample() {
	local pid=$1 file=$2 rss anon hi=0 hianon=0
	while [ -r "/proc/$pid/status" ]; do
		rss=$(kb "$pid" VmRSS) anon=$(kb "$pid" RssAnon)
		[ -n "$rss" ] && [ "$rss" -gt "$hi" ] && hi=$rss
		[ -n "$anon" ] && [ "$anon" -gt "$hianon" ] && hianon=$anon
		echo "$hi $hianon" >"$file.tmp" && mv "$file.tmp" "$file"
		sleep 0.2
	done
}

# settle pid: waits until write_bytes has not grown for 4 s (background
# compaction done) or SETTLE_MAX s passed; prints the seconds waited.
settle() {
	local pid=$1 last now same=0 waited=0
	last=$(wbytes "/proc/$pid/io")
	while [ "$waited" -lt "$SETTLE_MAX" ] && [ "$same" -lt 2 ]; do
		sleep 2
		waited=$((waited + 2))
		now=$(wbytes "/proc/$pid/io")
		if [ "$now" = "$last" ]; then same=$((same + 1)); else same=0; fi
		last=$now
	done
	echo "$waited"
}

bench_build
[ -n "$PEAT_BIN" ] && cp "$PEAT_BIN" "$work/peat"
label_env=""
[ -n "$PEAT_ENV" ] && label_env=" $PEAT_ENV"
[ "$DURABILITY" != fsync ] && label_env="$label_env $DURABILITY"
[ -n "$MAX_BYTES" ] && label_env="$label_env max_bytes $MAX_BYTES"
[ -n "$LINGER" ] && label_env="$label_env linger $LINGER"
per_publisher=$(((RECORDS + PUBLISHERS - 1) / PUBLISHERS))
: >"$work/ingest.tsv"
: >"$work/clients.tsv"

for profile in $PROFILES; do
	# --- 1. idle, then the ingest --------------------------------------
	start_peat "$profile" "ingest-$profile"
	sleep "$IDLE"
	idle=$(kb "$PID" VmRSS)
	w0=$(wbytes "/proc/$PID/io")
	sample "$PID" "$work/peak" &
	SAMPLER=$!
	line=$($pin_load "$work/peat-bench" fanin --addr 127.0.0.1:"$PORT" --publishers "$PUBLISHERS" --subscribers 0 \
		--count "$per_publisher" --qos 1 --window "$WINDOW" --payload "$PAYLOAD" --drain 1s --label "peat-$profile$label_env")
	w_ack=$(wbytes "/proc/$PID/io")
	heap=$(metric go_memstats_heap_inuse_bytes) stack=$(metric go_memstats_stack_inuse_bytes) sys=$(metric go_memstats_sys_bytes)
	kill "$SAMPLER" 2>/dev/null || true
	wait "$SAMPLER" 2>/dev/null || true
	SAMPLER=""
	read -r peak peak_anon <"$work/peak"
	hwm=$(kb "$PID" VmHWM)
	records=$(stream next_offset) record_bytes=$(stream bytes)
	waited=$(settle "$PID")
	w_settled=$(wbytes "/proc/$PID/io")
	settled_rss=$(kb "$PID" VmRSS)
	stop_peat
	cg_mb=$(cg_peak) cg_kills=$(cg_ooms)
	w_exit=$(wbytes "$work/ingest-$profile.io")
	disk=$(du -sb "$DATA" | cut -f1)
	rm -rf "$DATA"
	echo "peat-$profile$label_env ingest: $line" >&2
	echo "peat-$profile$label_env: records $records, at the end of the ingest Go heap in use ${heap} MB, stacks ${stack} MB, runtime total ${sys} MB; write_bytes settled after ${waited}s" >&2
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "peat-$profile$label_env" \
		"$(mb $((idle * 1024)))" "$(mb $((peak * 1024)))" "$(mb $((peak_anon * 1024)))" "$(mb $((hwm * 1024)))" \
		"$(mb $((settled_rss * 1024)))" "$(json acked_per_s "$line")" "$(json puback_p99_ms "$line")" \
		"$records" "$(div "$record_bytes" "$records")" "$(div $((w_ack - w0)) "$records")" \
		"$(div $((w_settled - w0)) "$records")" "$(div $((w_exit - w0)) "$records")" "$(div "$disk" "$records")" \
		"$cg_mb" "$cg_kills" >>"$work/ingest.tsv"

	# --- 2. many connected clients ------------------------------------
	[ "$CLIENTS" -gt 0 ] || continue
	start_peat "$profile" "clients-$profile"
	sleep "$IDLE"
	w0=$(wbytes "/proc/$PID/io")
	line=$($pin_load "$work/peat-bench" sensors --addr 127.0.0.1:"$PORT" --pid "$PID" --label "peat-$profile$label_env" \
		--connections "$CLIENTS" --rate "$CLIENT_RATE" --qos 1 --payload "$PAYLOAD" --duration "$CLIENT_DURATION")
	w1=$(wbytes "/proc/$PID/io")
	records=$(stream next_offset)
	stop_peat
	cg_mb=$(cg_peak) cg_kills=$(cg_ooms)
	w_exit=$(wbytes "$work/clients-$profile.io")
	rm -rf "$DATA"
	echo "peat-$profile$label_env clients: $line" >&2
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "peat-$profile$label_env" \
		"$(json rss_idle_mb "$line")" "$(json rss_connected_mb "$line")" "$(json rss_max_mb "$line")" \
		"$(json rss_peak_mb "$line")" "$(json acked "$line")/$(json sent "$line")" "$(json errors "$line")" \
		"$(json puback_p99_ms "$line")" "$records" "$(div $((w1 - w0)) "$records")" "$(div $((w_exit - w0)) "$records")" \
		"$cg_mb" "$cg_kills" >>"$work/clients.tsv"
done

fs=$(findmnt -no FSTYPE,SOURCE -T "$data_root" 2>/dev/null | tr -s ' ' || echo unknown)
echo
echo "$(date -u +%F), $(uname -sr), $(nproc) cores; data on $data_root ($fs); durability $DURABILITY${MEMORY_MAX:+; broker in a ${MEMORY_MAX} memory cgroup}"
echo
echo "Ingest: $RECORDS QoS 1 records of $PAYLOAD bytes from $PUBLISHERS publishers ($WINDOW in flight each), no subscriber. RSS in MB; bytes per record."
echo
echo "| profile | idle RSS | peak RSS | peak RssAnon | VmHWM | RSS settled | acks/s | PUBACK p99 ms | records | record bytes | write_bytes/rec at last ack | settled | incl. shutdown | disk bytes/rec | cgroup peak | OOM kills |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16 }' "$work/ingest.tsv"
[ "$CLIENTS" -gt 0 ] || exit 0
echo
echo "Clients: $CLIENTS connections, each publishing QoS 1 at $CLIENT_RATE msg/s ($PAYLOAD bytes) for $CLIENT_DURATION. RSS in MB."
echo
echo "| profile | idle RSS | RSS connected | peak RSS under load | VmHWM | acked/sent | errors | PUBACK p99 ms | records | write_bytes/rec | incl. shutdown | cgroup peak | OOM kills |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 }' "$work/clients.tsv"
