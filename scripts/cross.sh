#!/usr/bin/env bash
# Static release binaries for the Raspberry Pi family and amd64 (`make pi`),
# with the version and commit stamped in, and dist/SHA256SUMS.
#
#   scripts/cross.sh                    # every target below
#   TARGETS="arm64 amd64" scripts/cross.sh
#
# Targets (name: GOOS/GOARCH[/GOARM]):
#   arm64  linux/arm64     64-bit Raspberry Pi OS: Pi Zero 2 W, 3, 4, 5
#   armv7  linux/arm/7     32-bit Raspberry Pi OS on Pi 2, 3, 4
#   armv6  linux/arm/6     Pi Zero, Zero W, Pi 1
#   amd64  linux/amd64
#
# The 32-bit builds run Badger with the options logstore picks for 32-bit
# platforms (logstore/profile.go); `make test-arm` checks them under qemu.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
TARGETS=${TARGETS:-"arm64 armv7 armv6 amd64"}
DIST=${DIST:-dist}

mkdir -p "$DIST"
rm -f "$DIST"/peat-linux-* "$DIST"/SHA256SUMS
for t in $TARGETS; do
	case $t in
	arm64) env=(GOARCH=arm64) ;;
	armv7) env=(GOARCH=arm GOARM=7) ;;
	armv6) env=(GOARCH=arm GOARM=6) ;;
	amd64) env=(GOARCH=amd64) ;;
	*) echo "cross: unknown target $t (want arm64, armv7, armv6 or amd64)" >&2; exit 2 ;;
	esac
	out=$DIST/peat-linux-$t
	echo "cross: $out (${env[*]})"
	env CGO_ENABLED=0 GOOS=linux "${env[@]}" "$GO" build -trimpath \
		-ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" \
		-o "$out" ./cmd/peat
done
(cd "$DIST" && sha256sum peat-linux-* >SHA256SUMS)
echo "cross: $DIST/SHA256SUMS"
