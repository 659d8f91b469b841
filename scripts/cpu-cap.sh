#!/usr/bin/env bash
# Runs a command with a CPU budget of its own, as if it had a machine of
# that size (bench.sh W5: three nodes, each given what the single node gets):
#
#   scripts/cpu-cap.sh PREFIX PERCENT CMD...   run CMD in a new cgroup
#                                              PREFIX.<pid>, limited to PERCENT
#                                              of one CPU (a CFS quota, 100 ms period)
#   scripts/cpu-cap.sh --check                 exit 0 when this machine can
#   scripts/cpu-cap.sh --remove PREFIX         remove PREFIX.* once their
#                                              processes have exited
#
# The quota is the kernel's CPU bandwidth control (cgroup v1 cpu.cfs_quota_us,
# or v2 cpu.max), what a container runtime's --cpus sets. It needs root. CMD
# replaces this script (exec), so its pid is the one the caller started.
set -euo pipefail

period=100000

# base prints the directory new cgroups go in, or fails.
base() {
	if [ -w /sys/fs/cgroup/cpu/cgroup.procs ] && [ -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
		echo /sys/fs/cgroup/cpu # v1
		return 0
	fi
	if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
		# v2: children of the root get the cpu controller once it is enabled there.
		grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
			echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || return 1
		echo /sys/fs/cgroup
		return 0
	fi
	return 1
}

case ${1:-} in
--check)
	b=$(base) || exit 1
	probe="$b/peat-cap-check.$$"
	mkdir "$probe" 2>/dev/null || exit 1
	rmdir "$probe"
	exit 0
	;;
--remove)
	b=$(base) || exit 0
	for d in "$b/${2:?usage: $0 --remove PREFIX}".*; do
		[ -d "$d" ] && rmdir "$d" 2>/dev/null || true
	done
	exit 0
	;;
esac

[ $# -ge 3 ] || {
	echo "usage: $0 PREFIX PERCENT CMD..." >&2
	exit 2
}
prefix=$1 percent=$2
shift 2
[[ $percent =~ ^[1-9][0-9]*$ ]] || {
	echo "cpu-cap: PERCENT must be a whole number above 0, not $percent" >&2
	exit 2
}
b=$(base) || {
	echo "cpu-cap: no writable cgroup CPU controller (run as root on cgroup v1 or v2)" >&2
	exit 1
}
cg="$b/$prefix.$$"
mkdir "$cg"
quota=$((period * percent / 100))
if [ -e "$cg/cpu.max" ]; then
	echo "$quota $period" >"$cg/cpu.max"
else
	echo "$period" >"$cg/cpu.cfs_period_us"
	echo "$quota" >"$cg/cpu.cfs_quota_us"
fi
echo $$ >"$cg/cgroup.procs"
exec "$@"
