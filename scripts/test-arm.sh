#!/usr/bin/env bash
# Peat's tests on ARM under qemu user-mode emulation (`make test-arm`):
#
#   - arm64 (qemu-aarch64 as a Cortex-A53: Pi 3, Pi Zero 2 W): the logstore
#     package, and the MQTT publish, subscribe and restart tests of mqtt and
#     edge listed below;
#   - armv7 (qemu-arm as a Cortex-A7: Pi 2) and armv6 (qemu-arm as an
#     ARM1176: Pi 1, Pi Zero): the storage integrity test with 1,000,000
#     records, with the storage profile the store picks there;
#   - the peat binary of each of the three starts and prints its version;
#   - a three-node site of the arm64 binary (each node under qemu-aarch64):
#     cluster/sitetest's leader kill -9 test, one round (step site).
#
# No -race: it needs cgo, and a C cross-compiler under emulation. Installs
# Debian's qemu-user-static when it is missing (as root with apt-get), as
# scripts/test-deps.sh does for gcc.
#
#   scripts/test-arm.sh
#   STEPS="armv6" RECORDS=200000 scripts/test-arm.sh     # a quicker look
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
STEPS=${STEPS:-"arm64 armv7 armv6 version site"}
RECORDS=${RECORDS:-1000000}

# The arm64 MQTT tests: publishing (acks only when durable, in order),
# subscribing (live and from the log), restarts of broker and node, and a
# publishing client's read stack staying at 16 KiB (arm64 frames are as
# large as amd64's; on 32-bit ARM mochi's path fits 16 KiB anyway).
MQTT_TESTS="TestIngest_AckOnlyWhenDurable TestIngest_AcksInArrivalOrder
TestIngest_AppendsPublishesWithProperties TestDelivery_SubscribersGetRecordsFromTheLog
TestDelivery_MQTTPublishes TestDelivery_FanOut TestDurableSession_SurvivesABrokerRestart
TestGroup_SurvivesABrokerRestart TestIngest_PublishingKeepsTheReadStack"
EDGE_TESTS="TestNode_Lifecycle TestNode_RestartKeepsOffsets TestNode_HTTP"

need=()
for q in qemu-aarch64-static qemu-arm-static; do
	command -v $q >/dev/null 2>&1 || need=(qemu-user-static)
done
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "test-arm: installing ${need[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	else
		echo "test-arm: missing ${need[*]}; install it (Debian: apt-get install ${need[*]})" >&2
		exit 1
	fi
fi

export CGO_ENABLED=0 GOOS=linux
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
summary=()

# step NAME CMD...: runs CMD, prints and records how long it took.
step() {
	local name=$1 t0=$SECONDS
	shift
	echo "test-arm: $name"
	"$@"
	summary+=("$(printf '%-40s %4ds' "$name" $((SECONDS - t0)))")
}

# run_listed PKG TESTS: runs the named tests of PKG on arm64 under qemu and
# fails unless every one of them ran and passed (a renamed test must not
# drop out of the run unnoticed).
run_listed() {
	local pkg=$1 tests=$2 out=$work/out.txt
	local re
	re="^($(tr -s ' \n' '|' <<<"$tests" | sed 's/|$//'))\$"
	GOARCH=arm64 QEMU_CPU=cortex-a53 "$GO" test -count=1 -timeout 20m -exec qemu-aarch64-static -run "$re" -v "$pkg" >"$out" 2>&1 || {
		cat "$out"
		return 1
	}
	grep -E '^(--- |ok|PASS|FAIL)' "$out"
	for t in $tests; do
		grep -q "^--- PASS: $t " "$out" || {
			echo "test-arm: $t did not run in $pkg" >&2
			return 1
		}
	done
}

# integrity GOARM CPU: the 1,000,000-record integrity test on 32-bit ARM.
integrity() {
	GOARCH=arm GOARM=$1 QEMU_CPU=$2 "$GO" test -count=1 -timeout 30m -exec qemu-arm-static \
		-run '^TestStore_IntegrityAfterReopen$' -v ./logstore/ -args -integrity.records="$RECORDS"
}

# version: the peat binaries start on each ARM target and say what they are.
version() {
	local t goarch goarm emu cpu bin out
	for t in arm64:arm64::aarch64:cortex-a53 armv7:arm:7:arm:cortex-a7 armv6:arm:6:arm:arm1176; do
		IFS=: read -r _ goarch goarm emu cpu <<<"$t"
		bin=$work/peat-$goarch$goarm
		GOARCH=$goarch GOARM=$goarm "$GO" build -ldflags "-X main.version=test-arm -X main.commit=0000000" -o "$bin" ./cmd/peat
		out=$(QEMU_CPU=$cpu "qemu-$emu-static" "$bin" version)
		echo "$out"
		case $out in
		*"test-arm (commit 0000000"*"linux/$goarch"*) ;;
		*) echo "test-arm: unexpected output of ${t%%:*} peat version" >&2; return 1 ;;
		esac
	done
}

# site: the arm64 peat binary as three nodes of a site under qemu-user, one
# leader kill -9 round under QoS 1 load; the test itself runs natively.
site() {
	local bin=$work/peat-site-arm64
	GOARCH=arm64 "$GO" build -o "$bin" ./cmd/peat
	env -u GOARCH -u GOARM QEMU_CPU=cortex-a53 PEAT_SITETEST=1 "$GO" test -count=1 -timeout 20m -v \
		-run '^TestSite_LeaderKill$' ./cluster/sitetest/ \
		-args -sitetest.bin="$bin" -sitetest.exec=qemu-aarch64-static -sitetest.rounds=1 -sitetest.slow=4
}

for s in $STEPS; do
	case $s in
	arm64)
		# qemu-user (7.2) answers madvise with success and passes only
		# MADV_DONTNEED on to the kernel, so pages handed back with
		# MADV_PAGEOUT stay resident there: the test that checks they
		# leave cannot pass under it, and runs natively in make test.
		# PEAT_TEST_EXEC: the kill -9 test runs its child under qemu too.
		step "arm64: logstore" env GOARCH=arm64 QEMU_CPU=cortex-a53 PEAT_TEST_EXEC=qemu-aarch64-static "$GO" test -count=1 -timeout 20m -exec qemu-aarch64-static \
			-skip '^TestMapped_PageOutGivesPagesBackAndKeepsData$' ./logstore/
		step "arm64: mqtt publish/subscribe/restart" run_listed ./mqtt/ "$MQTT_TESTS"
		step "arm64: edge node restart" run_listed ./edge/ "$EDGE_TESTS"
		;;
	armv7) step "armv7: integrity, $RECORDS records" integrity 7 cortex-a7 ;;
	armv6) step "armv6: integrity, $RECORDS records" integrity 6 arm1176 ;;
	version) step "peat version on arm64, armv7, armv6" version ;;
	site) step "arm64: three-node site, leader kill -9" site ;;
	*) echo "test-arm: unknown step $s (want arm64, armv7, armv6, version, site)" >&2; exit 2 ;;
	esac
done
echo "test-arm: passed"
printf '  %s\n' "${summary[@]}"
