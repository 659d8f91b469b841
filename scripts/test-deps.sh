#!/usr/bin/env bash
# Installs what `make test` needs on a fresh machine, and does nothing when it
# is already there. The race detector needs a C toolchain (cgo); the MQTT tests
# use Go clients fetched through the module proxy, and Debian's mosquitto_sub
# (the replay protocol must work from any stock MQTT client); the small-disk
# tests mkfs.ext4 (e2fsprogs) and mount; the status page test drives Debian's
# chromium (headless, through chromedp); the sink tests run Debian's
# mosquitto broker as the upstream; the partition tests (make
# test-partition) put each node in a network namespace (iproute2's ip) and
# cut links with nftables. The sources' tests need a Mosquitto that keeps the
# Receive Maximum (2.0.13 or newer; bookworm's is 2.0.11):
# scripts/mosquitto-current.sh builds one when the system's is older.
set -euo pipefail

need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v mosquitto_sub >/dev/null 2>&1 || need+=(mosquitto-clients)
# edge/auth reads password files made by Debian's mosquitto_passwd; the
# sink tests run its mosquitto broker (same package).
command -v mosquitto_passwd >/dev/null 2>&1 || need+=(mosquitto)
# The small-disk tests of logstore loop-mount an ext4 image (as root).
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v mount >/dev/null 2>&1 || need+=(mount)
# cmd/peat's status page test fails (never skips) without it.
[ -x /usr/bin/chromium ] || need+=(chromium)
# scripts/benchtable checks that bench.sh's chart script draws.
command -v gnuplot >/dev/null 2>&1 || need+=(gnuplot-nox)
# cluster/sitetest's partition tests: namespaces, veths, a bridge, drops.
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "test-deps: installing ${need[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	else
		echo "test-deps: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
		exit 1
	fi
fi

"$(dirname "$0")/mosquitto-current.sh"
go mod download
