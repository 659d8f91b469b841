#!/usr/bin/env bash
# Provides the tests with a Mosquitto that keeps the client's Receive Maximum
# [MQTT-3.3.4-9]: scripts/.mosquitto/mosquitto, which edge/sink/sinktest
# runs in preference to the system's.
#
# Why: Debian bookworm ships Mosquitto 2.0.11, whose PUBACK handling moves up
# to a whole window of queued messages into flight per acknowledgement (its
# own bug #2306, fixed in 2.0.13). A source pulling from it after a
# reconnect is sent hundreds of messages beyond its Receive Maximum, and a
# kill -9 then repeats them all, so the sources' "at most one window
# repeated" bound cannot be tested against it. Users' clouds run current
# Mosquittos.
#
# How: when the system's mosquitto is older than 2.0.13, build the broker
# (only the broker, no websockets, cJSON or docs) from the mosquitto source
# package of the next Debian release, fetched through apt from the mirror
# this machine already uses, with apt's state kept under scripts/.mosquitto
# so the system's sources are left alone. Does nothing when already built.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=scripts/.mosquitto
release=trixie # the Debian release whose mosquitto is built (2.0.21 there)

version_ok() { # mosquitto binary -> 0 when 2.0.13 or newer
	local v
	v=$({ "$1" -h 2>&1 || true; } | sed -n 's/^mosquitto version \([0-9.]*\).*/\1/p' | head -1)
	[ -n "$v" ] && [ "$(printf '%s\n2.0.13\n' "$v" | sort -V | head -1)" = 2.0.13 ]
}

[ -x "$dir/mosquitto" ] && version_ok "$dir/mosquitto" && exit 0
sys=$(command -v mosquitto || true)
[ -z "$sys" ] && [ -x /usr/sbin/mosquitto ] && sys=/usr/sbin/mosquitto
[ -n "$sys" ] && version_ok "$sys" && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
	echo "mosquitto-current: the tests need Mosquitto 2.0.13 or newer at $dir/mosquitto;" \
		"run this script as root on Debian to build it" >&2
	exit 1
fi

need=()
for p in gcc make libc6-dev libssl-dev dpkg-dev xz-utils; do
	dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	echo "mosquitto-current: installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The mirror of the release this machine runs, from apt's own configuration.
. /etc/os-release
mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' |
	awk -v r="$VERSION_CODENAME" '$2 == r { print $1; exit }')
if [ -z "$mirror" ]; then
	echo "mosquitto-current: no apt source for $VERSION_CODENAME to take the mirror from" >&2
	exit 1
fi

rm -rf "$dir"
mkdir -p "$dir/apt/lists/partial" "$dir/build"
abs=$(cd "$dir" && pwd)
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror%/} $release main" >"$dir/apt/sources.list"
apt=(-o "Dir::Etc::sourcelist=$abs/apt/sources.list" -o Dir::Etc::sourceparts=/nonexistent
	-o "Dir::State::Lists=$abs/apt/lists" -o APT::Sandbox::User=root)
echo "mosquitto-current: building Mosquitto from Debian $release's source package"
apt-get "${apt[@]}" update -qq
(cd "$dir/build" && apt-get "${apt[@]}" source -qq mosquitto >/dev/null)
src=$(find "$dir/build" -mindepth 1 -maxdepth 1 -type d -name 'mosquitto-*' | head -1)
make -s -j"$(nproc)" -C "$src/src" WITH_CJSON=no WITH_WEBSOCKETS=no WITH_DOCS=no WITH_SYSTEMD=no \
	WITH_SRV=no WITH_WRAP=no WITH_DLT=no >"$dir/build.log" 2>&1 || {
	tail -20 "$dir/build.log" >&2
	exit 1
}
cp "$src/src/mosquitto" "$dir/mosquitto"
rm -rf "$dir/build" "$dir/apt"
version_ok "$dir/mosquitto" || {
	echo "mosquitto-current: the build is older than 2.0.13" >&2
	exit 1
}
{ "$dir/mosquitto" -h 2>&1 || true; } | head -1 # -h exits 3
