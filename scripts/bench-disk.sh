#!/usr/bin/env bash
# Disk space under size retention (issue 17, item 8). For each profile and
# record size, scripts/diskbench opens a fresh store with one stream of
# max_bytes MAX_BYTES (fsync durability, default retention and reclaim
# intervals), pushes TIMES x MAX_BYTES of records through it from WRITERS
# appenders (batches of up to 256 KiB), samples the disk the store's files
# take (allocated blocks) every 50 ms, and prints a markdown table: the peak
# and final disk use against max_bytes and against Store.DiskBound (twice
# max_bytes plus the profile's overhead, logstore/space_bound.go).
#
#   scripts/bench-disk.sh                                  # pi-zero and server, 16 B to 1 MiB, 16 MiB x 8
#   PROFILES=pi-zero SIZES="16 16384" scripts/bench-disk.sh
#   MAX_BYTES=$((32<<20)) TIMES=4 scripts/bench-disk.sh
#   DATA_ROOT=/mnt/sd scripts/bench-disk.sh                # the filesystem to measure on
#
# MB/s is what the pushes got, retention and reclaims included: a figure
# for comparing runs on one machine, not a target. Takes 1-3 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILES=${PROFILES:-"pi-zero server"}
SIZES=${SIZES:-"16 128 1024 16384 262144 1048576"}
MAX_BYTES=${MAX_BYTES:-$((16 << 20))}
TIMES=${TIMES:-8}
WRITERS=${WRITERS:-4}
DATA_ROOT=${DATA_ROOT:-${TMPDIR:-/tmp}}

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/diskbench" ./scripts/diskbench

echo "max_bytes $((MAX_BYTES >> 20)) MiB, $TIMES x max_bytes pushed, data on $(df --output=source,fstype "$DATA_ROOT" | tail -1 | tr -s ' ')"
echo
echo "| profile | payload | pushed MiB | peak disk MiB | final disk MiB | peak / max_bytes | bound MiB | MB/s | reclaims |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for p in $PROFILES; do
	for s in $SIZES; do
		out=$("$bin/diskbench" -dir "$DATA_ROOT" -profile "$p" -payload "$s" -max-bytes "$MAX_BYTES" -times "$TIMES" -writers "$WRITERS")
		python3 - "$out" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
mib = 1 << 20
print(f"| {r['profile']} | {r['payload_bytes']} | {r['pushed_bytes'] // mib} | {r['peak_disk_bytes'] / mib:.0f} | "
      f"{r['final_disk_bytes'] / mib:.0f} | {r['peak_disk_bytes'] / r['max_bytes']:.1f} | {r['bound_bytes'] // mib} | "
      f"{r['pushed_mb_per_s']:.0f} | {r['reclaims']:.0f} |")
PY
	done
done
