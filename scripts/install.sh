#!/usr/bin/env bash
# Installs Peat as a systemd service: the binary, the unit and a config.
# Run it again to upgrade: the binary and the unit are replaced, an existing
# /etc/peat/peat.yaml is kept. See --help.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: scripts/install.sh [--binary PATH|DIR] [--arch ARCH] [--destdir DIR]

Installs Peat as a systemd service:

  usr/local/bin/peat                 the binary (mode 0755)
  etc/systemd/system/peat.service    the unit (configs/peat.service)
  etc/peat/peat.yaml                 the config (configs/peat.yaml with data_dir
                                     /var/lib/peat); an existing one is kept

under DESTDIR (default /). Only when DESTDIR is / (run as root) does it also
create the system user and group `peat` and run `systemctl daemon-reload`; it
starts nothing. For any other DESTDIR (an image for a board, a package) it
says what to do on the target instead. Safe to run again: that is an upgrade.

Options:
  --binary PATH  the peat binary (default bin/peat, from `make build`); it must
                 be a Linux executable. If PATH is a directory (e.g. dist from
                 `make pi`), the peat-linux-* binary matching ARCH is chosen. A
                 SHA256SUMS file beside the binary is checked when it lists it.
  --arch ARCH    the target: amd64, arm64, armv7 or armv6 (default: this
                 machine's). With DESTDIR=/ the binary must match this machine.
  --destdir DIR  install root; same as the DESTDIR environment variable.
  -h, --help     this help.

Then, on the target:
  sudo systemctl enable --now peat
  journalctl -u peat -f
EOF
}

die() {
	echo "install.sh: $*" >&2
	exit 1
}
say() { echo "install.sh: $*"; }

root_dir=$(cd "$(dirname "$0")/.." && pwd)
binary=""
arch=""
DESTDIR=${DESTDIR:-/}

while [ $# -gt 0 ]; do
	case $1 in
	-h | --help) usage; exit 0 ;;
	--binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
	--binary=*) binary=${1#*=}; shift ;;
	--arch) [ $# -ge 2 ] || die "--arch needs a value"; arch=$2; shift 2 ;;
	--arch=*) arch=${1#*=}; shift ;;
	--destdir) [ $# -ge 2 ] || die "--destdir needs a directory"; DESTDIR=$2; shift 2 ;;
	--destdir=*) DESTDIR=${1#*=}; shift ;;
	*) usage >&2; die "unknown argument '$1'" ;;
	esac
done

# --- Architectures ------------------------------------------------------

# machine_arch prints this machine's architecture as amd64, arm64, armv7 or
# armv6: the userland's (dpkg), which is what systemd and the loader run,
# not the kernel's (a 64-bit kernel often runs a 32-bit Raspberry Pi OS).
machine_arch() {
	local a
	a=$(dpkg --print-architecture 2>/dev/null || uname -m)
	case $a in
	amd64 | x86_64) echo amd64 ;;
	arm64 | aarch64) echo arm64 ;;
	armhf | armel | arm*)
		# Raspberry Pi OS's armhf also runs on the ARMv6 Pi Zero and Pi 1.
		case $(uname -m) in
		armv6*) echo armv6 ;;
		*) echo armv7 ;;
		esac
		;;
	*) echo "$a" ;;
	esac
}

# binary_arch FILE prints the architecture of a Linux executable (amd64,
# arm64, armv7, armv6, or other-<machine>), or fails if FILE is not one.
binary_arch() {
	local f=$1 magic class machine
	magic=$(head -c 4 "$f" | od -An -c | tr -d ' ')
	[ "$magic" = '177ELF' ] || return 1
	class=$(od -An -tu1 -j4 -N1 "$f" | tr -d ' ')   # 1: 32-bit, 2: 64-bit
	machine=$(od -An -tu1 -j18 -N1 "$f" | tr -d ' ') # e_machine, low byte (little-endian)
	case $class:$machine in
	2:62) echo amd64 ;;
	2:183) echo arm64 ;;
	1:40)
		# Go records GOARM in the build info it embeds in every binary.
		if grep -aq 'GOARM=6' "$f"; then echo armv6; else echo armv7; fi
		;;
	*) echo "other-$class-$machine" ;;
	esac
}

# runs_on BINARY_ARCH TARGET_ARCH: can a binary built for the first run on
# the second? ARMv6 code runs on ARMv7 (slower), not the other way round.
runs_on() {
	[ "$1" = "$2" ] || { [ "$1" = armv6 ] && [ "$2" = armv7 ]; }
}

# --- Inputs --------------------------------------------------------------

[ -n "$DESTDIR" ] || die "DESTDIR is empty; use / for this machine"
mkdir -p "$DESTDIR" 2>/dev/null || die "cannot create DESTDIR $DESTDIR"
dest=$(cd "$DESTDIR" && pwd -P)
real=false
[ "$dest" = / ] && real=true
if $real && [ "$(id -u)" -ne 0 ]; then
	die "installing into / needs root: run it with sudo, or set DESTDIR to install elsewhere"
fi

here=$(machine_arch)
target=${arch:-$here}
case $target in
amd64 | arm64 | armv7 | armv6) ;;
*) die "unknown --arch '$target', want amd64, arm64, armv7 or armv6" ;;
esac
if $real && [ "$target" != "$here" ] && ! runs_on "$target" "$here"; then
	die "--arch $target does not run on this $here machine"
fi

[ -n "$binary" ] || binary=$root_dir/bin/peat
if [ -d "$binary" ]; then
	dir=$binary
	binary=""
	# An exact match first; an armv7 board also runs the armv6 build.
	for want in "$target" armv6; do
		for f in "$dir"/peat-linux-*; do
			[ -f "$f" ] || continue
			if [ "$(binary_arch "$f" || true)" = "$want" ] && runs_on "$want" "$target"; then
				binary=$f
				break 2
			fi
		done
	done
	[ -n "$binary" ] || die "no peat-linux-* binary for $target in $dir (build them with 'make pi')"
fi
if [ ! -f "$binary" ]; then
	if [ "$binary" = "$root_dir/bin/peat" ]; then
		die "no binary at bin/peat: run 'make build', or name one with --binary"
	fi
	die "no binary at $binary"
fi
got=$(binary_arch "$binary") || die "$binary is not a Linux executable (no ELF header)"
if ! runs_on "$got" "$target"; then
	if $real || [ -n "$arch" ]; then
		die "$binary is built for $got, which does not run on $target; pick the matching dist/peat-linux-* binary"
	fi
	say "note: $binary is built for $got, not for this $here machine (installing into $dest anyway)"
fi

# A SHA256SUMS beside the binary (from `make pi`) vouches for its content:
# an SD card or a copy over the network can corrupt it.
sums=$(dirname "$binary")/SHA256SUMS
name=$(basename "$binary")
if [ -f "$sums" ] && grep -Eq "^[0-9a-f]{64} [ *]$name\$" "$sums"; then
	(cd "$(dirname "$binary")" && grep -E "^[0-9a-f]{64} [ *]$name\$" SHA256SUMS | sha256sum -c --quiet >/dev/null 2>&1) ||
		die "$binary does not match its checksum in $sums: copy it again"
	say "checksum of $name matches $sums"
fi

unit_src=$root_dir/configs/peat.service
config_src=$root_dir/configs/peat.yaml
[ -f "$unit_src" ] || die "missing $unit_src"
[ -f "$config_src" ] || die "missing $config_src"

# --- Install --------------------------------------------------------------

# put SRC DST MODE: writes DST atomically (a running peat keeps its old
# binary), and says whether it changed.
put() {
	local src=$1 dst=$2 mode=$3
	mkdir -p "$(dirname "$dst")"
	if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
		chmod "$mode" "$dst"
		say "unchanged $dst"
		return
	fi
	local what=installed
	[ -e "$dst" ] && what=updated
	install -m "$mode" "$src" "$dst.new"
	mv -f "$dst.new" "$dst"
	say "$what $dst"
	changed=true
}
changed=false

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bin_dst=$dest/usr/local/bin/peat
unit_dst=$dest/etc/systemd/system/peat.service
config_dst=$dest/etc/peat/peat.yaml
[ "$dest" = / ] && bin_dst=/usr/local/bin/peat unit_dst=/etc/systemd/system/peat.service config_dst=/etc/peat/peat.yaml

put "$binary" "$bin_dst" 0755
put "$unit_src" "$unit_dst" 0644

# The config: configs/peat.yaml with the data directory the unit uses
# (the unit's --data flag wins anyway; this keeps the file truthful).
sed 's|^data_dir:.*|data_dir: /var/lib/peat|' "$config_src" >"$tmp/peat.yaml"
grep -q '^data_dir: /var/lib/peat$' "$tmp/peat.yaml" || die "configs/peat.yaml has no top-level data_dir line to set"
if [ -e "$config_dst" ]; then
	if cmp -s "$tmp/peat.yaml" "$config_dst"; then
		say "unchanged $config_dst"
	else
		say "kept $config_dst (it differs from configs/peat.yaml: compare them after an upgrade)"
	fi
else
	# 0640 root:peat: the service reads it, other users do not (it will hold
	# credentials for upstream sinks and TLS).
	mode=0640
	$real || mode=0644
	put "$tmp/peat.yaml" "$config_dst" "$mode"
fi

# --- The system user, and systemd -----------------------------------------

user_cmd="useradd --system --user-group --home-dir /var/lib/peat --no-create-home --shell /usr/sbin/nologin --comment 'Peat MQTT broker' peat"
if ! $real; then
	say "DESTDIR is $dest, not /: not creating the user and not reloading systemd. On the target, as root:"
	say "  id peat >/dev/null 2>&1 || $user_cmd"
	say "  chgrp peat /etc/peat/peat.yaml && chmod 0640 /etc/peat/peat.yaml"
	say "  systemctl daemon-reload && systemctl enable --now peat"
	exit 0
fi

if id peat >/dev/null 2>&1; then
	say "user peat exists"
else
	command -v useradd >/dev/null || die "useradd not found: create a system user and group 'peat' by hand"
	nologin=/usr/sbin/nologin
	[ -x "$nologin" ] || nologin=/sbin/nologin
	[ -x "$nologin" ] || nologin=/bin/false
	useradd --system --user-group --home-dir /var/lib/peat --no-create-home --shell "$nologin" --comment 'Peat MQTT broker' peat
	say "created system user and group peat"
fi
# Only a config this script wrote is re-owned; an operator's is left alone.
if [ "$(stat -c %U:%G "$config_dst")" = root:root ] && cmp -s "$tmp/peat.yaml" "$config_dst"; then
	chgrp peat "$config_dst"
	chmod 0640 "$config_dst"
fi

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	say "systemd reloaded"
	if systemctl is-active --quiet peat; then
		if $changed; then
			say "peat is running the previous version: sudo systemctl restart peat"
		fi
	else
		say "start it: sudo systemctl enable --now peat"
	fi
else
	say "systemd is not running here: start /usr/local/bin/peat another way"
fi
