#!/usr/bin/env bash
# A local site of Peat nodes on loopback, in one command (issue 19):
#
#   scripts/site.sh up N DIR      start N nodes (1-5), wait until the site
#                                 serves, print one line per node:
#                                 node=<id> mqtt=127.0.0.1:<port> http=127.0.0.1:<port> pid=<pid>
#   scripts/site.sh down DIR      stop them: SIGTERM (a graceful hand-over),
#                                 SIGKILL after STOP_TIMEOUT seconds (30)
#   scripts/site.sh start DIR K   start node K again on its config (after a kill)
#   scripts/site.sh stop DIR K    stop node K as down does
#   scripts/site.sh leader DIR [STREAM]   the node id leading STREAM (default)
#
# Node K (node1..nodeN) keeps its config in DIR/nodeK/peat.yaml, its data in
# DIR/nodeK/data, its log in DIR/nodeK/peat.log and its pid in DIR/nodeK/pid.
# Ports are free ones picked at `up` and kept in the config, so a node
# restarted with `start` has the same addresses. Every node lists every
# node's gossip address in cluster.join. Voters: the largest odd number up
# to N (at most 5); with N even the last node is a broker (voter: false).
# replication_factor is N up to 3 (the default would be the voters, 1 of
# a two-node site).
# `up` on a DIR that already holds a site starts its nodes again.
#
# The binary is bin/peat (built with `make build` when missing), or PEAT_BIN.
# SITE_EXTRA names a YAML file appended to every node's config (streams,
# mqtt settings: each node lists the same streams). PEAT_WRAP is a command
# each node runs under (taskset -c 0, qemu-aarch64-static). `up` waits WAIT seconds
# (120) for: a controller (a node logged "cluster: controller"), every
# configured stream with a replica role on as many nodes as it has
# replicas, and its ISR full: on a fresh site the leader has not shrunk it
# since it took the role; when `up` started nodes of an existing site
# again, the leader has proposed an ISR of every replica since (read from
# the logs: "cluster: replica role" and "cluster: proposing ISR" lines).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PEAT_BIN=${PEAT_BIN:-$root/bin/peat}
WAIT=${WAIT:-120}
STOP_TIMEOUT=${STOP_TIMEOUT:-30}

die() { echo "site: $*" >&2; exit 1; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pick_base sets BASE to a port with the next four free too (MQTT, HTTP,
# Serf, Raft, transport), below the usual ephemeral range, not in USED.
USED=" "
RESTARTED="" # when up started nodes of an existing site again
pick_base() {
	local k ok
	for _ in $(seq 100); do
		BASE=$((20000 + RANDOM % 12000))
		ok=1
		for k in 0 1 2 3 4; do
			if [[ $USED == *" $((BASE + k)) "* ]] || ! port_free $((BASE + k)); then
				ok=0
				break
			fi
		done
		if [ $ok = 1 ]; then
			for k in 0 1 2 3 4; do USED+="$((BASE + k)) "; done
			return 0
		fi
	done
	die "no five free ports in a row found"
}

# write_configs N DIR: DIR/nodeK/peat.yaml for K in 1..N.
write_configs() {
	local n=$1 dir=$2 voters=$(($1 > 5 ? 5 : $1)) k bases=() join=""
	[ $((voters % 2)) -eq 0 ] && voters=$((voters - 1))
	for k in $(seq "$n"); do
		pick_base
		bases+=("$BASE")
		join+="${join:+, }127.0.0.1:$((BASE + 2))"
	done
	for k in $(seq "$n"); do
		local b=${bases[k - 1]} d=$dir/node$k voter=true expect=$voters
		if [ "$k" -gt "$voters" ]; then voter=false expect=0; fi
		mkdir -p "$d"
		{
			echo "# node$k of a local site (scripts/site.sh up $n $dir)."
			echo "data_dir: $d/data"
			echo "http: {listen: 127.0.0.1:$((b + 1))}"
			echo "mqtt: {listen: 127.0.0.1:$b}"
			echo "cluster:"
			echo "  name: local"
			echo "  node_id: node$k"
			echo "  listen: 127.0.0.1:$((b + 2))"
			echo "  raft_listen: 127.0.0.1:$((b + 3))"
			echo "  transport_listen: 127.0.0.1:$((b + 4))"
			echo "  join: [$join]"
			echo "  voter: $voter"
			echo "  expect: $expect"
			echo "  replication_factor: $(($n > 3 ? 3 : $n))"
			if [ -n "${SITE_EXTRA:-}" ]; then cat "$SITE_EXTRA"; fi
		} >"$d/peat.yaml"
	done
}

nodes() { # DIR: the node directories, in order
	local d
	for d in "$1"/node*/; do
		[ -f "$d/peat.yaml" ] && basename "$d"
	done | sort -V
}

# running NODEDIR: its process is alive. A killed node whose parent (an
# earlier site.sh) is gone may stay a zombie until init reaps it, which
# kill -0 still finds: read the state from /proc.
running() {
	local pid state
	[ -f "$1/pid" ] || return 1
	pid=$(cat "$1/pid")
	state=$(sed -n 's/^[0-9]* (.*) \([A-Z]\).*/\1/p' "/proc/$pid/stat" 2>/dev/null) || return 1
	[ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

start_node() { # DIR K
	local d=$1/$2
	[ -f "$d/peat.yaml" ] || die "$d/peat.yaml: no such node"
	if running "$d"; then return 0; fi
	# setsid: the node keeps running after this shell, and a Ctrl-C here
	# does not reach it.
	# shellcheck disable=SC2086 # PEAT_WRAP is a command and its words
	setsid ${PEAT_WRAP:-} "$PEAT_BIN" serve --config "$d/peat.yaml" --log-format text >>"$d/peat.log" 2>&1 </dev/null &
	echo $! >"$d/pid"
}

stop_node() { # DIR K
	local d=$1/$2 pid
	running "$d" || { rm -f "$d/pid"; return 0; }
	pid=$(cat "$d/pid")
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq $((STOP_TIMEOUT * 10))); do
		kill -0 "$pid" 2>/dev/null || { rm -f "$d/pid"; return 0; }
		sleep 0.1
	done
	echo "site: $2 (pid $pid) still runs ${STOP_TIMEOUT}s after SIGTERM: SIGKILL" >&2
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$d/pid"
}

# streams DIR: the stream names the nodes are configured with (default
# when the config lists none).
streams() {
	local s
	s=$(sed -n '/^streams:/,/^[a-z]/s/^ *- *name: *\([^ ]*\).*/\1/p' "$1/node1/peat.yaml" | tr -d '"')
	echo "${s:-default}"
}

# since_start LOG: the lines of the node's last run (logs are appended).
since_start() { awk '/msg="starting peat"/ { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }' "$1"; }

leader_of() { # DIR STREAM: the node whose current role for STREAM is leader
	local k last
	for k in $(nodes "$1"); do
		running "$1/$k" || continue
		last=$(since_start "$1/$k/peat.log" | grep 'msg="cluster: replica role"' | grep "stream=$2 " | tail -1 || true)
		[[ $last == *" leader=true "* ]] && { echo "$k"; return 0; }
	done
	return 1
}

# ready DIR: a controller, a role for every stream on every running node,
# and no ISR shrink since the leader took its role.
ready() {
	local dir=$1 k s lead isr
	grep -q 'msg="cluster: controller"' "$dir"/node*/peat.log 2>/dev/null || return 1
	local n rf roles
	n=$(nodes "$dir" | wc -l)
	rf=$((n > 3 ? 3 : n))
	for s in $(streams "$dir"); do
		roles=0
		for k in $(nodes "$dir"); do
			# No grep -q in a pipe: its early exit would fail the pipe (pipefail).
			[ "$(since_start "$dir/$k/peat.log" | grep 'msg="cluster: replica role"' | grep -c "stream=$s ")" -gt 0 ] &&
				roles=$((roles + 1))
		done
		[ "$roles" -ge "$rf" ] || return 1
		lead=$(leader_of "$dir" "$s") || return 1
		isr=$(since_start "$dir/$lead/peat.log" | awk -v s="stream=$s " '
			/msg="cluster: replica role"/ && index($0, s) { isr = "" }
			/msg="cluster: proposing ISR"/ && index($0, s) { isr = $0 }
			END { print isr }')
		# A fresh site starts with every replica in the ISR; a node started
		# again rejoins it when the leader proposes it back, after RESTARTED.
		if [ -n "$isr" ] || [ -n "$RESTARTED" ]; then
			# time=... msg="cluster: proposing ISR" ... isr="[{ID:node2 Epoch:...} {ID:node3 Epoch:...}]"
			[ "$(grep -o 'ID:' <<<"$isr" | wc -l)" -eq "$rf" ] || return 1
			[ -z "$RESTARTED" ] || [[ ! ${isr#time=} < $RESTARTED ]] || return 1
		fi
	done
}

serving() { # DIR K: the addresses of the node's last "node serving" line
	local l
	l=$(grep 'msg="node serving"' "$1/$2/peat.log" | tail -1) || return 1
	echo "node=$2 mqtt=$(sed -n 's/.* mqtt=\([^ ]*\).*/\1/p' <<<"$l") http=$(sed -n 's/.* http=\([^ ]*\).*/\1/p' <<<"$l") pid=$(cat "$1/$2/pid")"
}

up() {
	local n=$1 dir=$2 k
	[[ $n =~ ^[1-5]$ ]] || die "up: N must be 1 to 5, got $n"
	if [ ! -x "$PEAT_BIN" ]; then
		[ "$PEAT_BIN" = "$root/bin/peat" ] || die "$PEAT_BIN: no such binary"
		make -C "$root" build >&2
	fi
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [ -z "$(nodes "$dir")" ]; then
		write_configs "$n" "$dir"
	elif [ "$(nodes "$dir" | wc -l)" -ne "$n" ]; then
		die "$dir holds a site of $(nodes "$dir" | wc -l) nodes, not $n"
	fi
	RESTARTED=""
	for k in $(nodes "$dir"); do
		if [ -s "$dir/$k/peat.log" ] && ! running "$dir/$k"; then RESTARTED=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ); fi
	done
	for k in $(nodes "$dir"); do start_node "$dir" "$k"; done
	local deadline=$((SECONDS + WAIT))
	until ready "$dir"; do
		for k in $(nodes "$dir"); do
			running "$dir/$k" || { tail -20 "$dir/$k/peat.log" >&2; die "$k exited (log: $dir/$k/peat.log)"; }
		done
		[ $SECONDS -lt $deadline ] || die "the site did not form within ${WAIT}s (logs: $dir/node*/peat.log)"
		sleep 0.2
	done
	for k in $(nodes "$dir"); do serving "$dir" "$k"; done
}

down() {
	local dir=$1 k
	[ -d "$dir" ] || die "$dir: no such directory"
	for k in $(nodes "$dir" | sort -rV); do stop_node "$dir" "$k" & done
	wait
}

case ${1:-} in
up) [ $# -eq 3 ] || die "usage: $0 up N DIR"; up "$2" "$3" ;;
down) [ $# -eq 2 ] || die "usage: $0 down DIR"; down "$2" ;;
start) [ $# -eq 3 ] || die "usage: $0 start DIR K"; start_node "$2" "node${3#node}" ;;
stop) [ $# -eq 3 ] || die "usage: $0 stop DIR K"; stop_node "$2" "node${3#node}" ;;
leader) [ $# -ge 2 ] || die "usage: $0 leader DIR [STREAM]"; leader_of "$2" "${3:-default}" || die "no leader found" ;;
*) die "usage: $0 up N DIR | down DIR | start DIR K | stop DIR K | leader DIR [STREAM]" ;;
esac
