#!/usr/bin/env bash
# The README's two commands on Debian 13 ("trixie"), beside the Debian 12 machine CI runs on: a
# fresh Debian 13 root made from Debian's packages with debootstrap (as scripts/make-base-image.sh
# makes the image's base), a copy of this checkout's tracked files in it, and then, inside it as
# root: scripts/test.sh (installs what is missing with apt, builds, runs every test) and
# scripts/run.sh --discover (the run command, on this machine's hardware: none).
#   usage: scripts/check-debian13.sh [mirror]
# The root is kept in build-debian13/ and reused while it exists (delete it for a fresh one).
set -euo pipefail
cd "$(dirname "$0")/.."
mirror=${1:-http://deb.debian.org/debian}
[ "$(id -u)" -eq 0 ] || { echo "check-debian13.sh: run as root (debootstrap, chroot, mknod)" >&2; exit 1; }
scripts/deps.sh debootstrap
work=$PWD/build-debian13
root=$work/root

# Nothing of the host may stay mounted in a root about to be deleted (an interrupted run).
unmount_all() {
  local m
  for m in $(findmnt -rn -o TARGET | grep -F "$root/" | sort -r); do umount -l "$m" 2>/dev/null || true; done
}
unmount_all
if [ ! -e "$work/.made" ]; then
  rm -rf --one-file-system "$work"
  mkdir -p "$work"
  start=$SECONDS
  debootstrap --variant=minbase --include=ca-certificates trixie "$root" "$mirror" \
    > "$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log"; exit 1; }
  echo 'APT::Install-Recommends "false";' > "$root/etc/apt/apt.conf.d/no-recommends"
  touch "$work/.made"
  echo "Debian 13 root made in $((SECONDS - start)) s"
fi
grep -q '^VERSION_ID="13"' "$root/etc/os-release" ||
  { echo "check-debian13.sh: $root is not Debian 13" >&2; exit 1; }

# What the chroot needs of the host: the kernel's file systems (the tests read /proc, make
# device nodes, use inotify and Unix sockets) and name resolution for apt. Undone on any exit.
trap unmount_all EXIT
for fs in proc sys dev dev/pts; do
  mkdir -p "$root/$fs"
  mount --bind "/$fs" "$root/$fs"
done
mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
cp -L /etc/hosts "$root/etc/hosts"  # localhost, as every machine and container has it

# A clean copy of the checkout: what git tracks, as it is in the work tree (CI's is clean); or,
# outside a git work tree, everything but build output.
rm -rf --one-file-system "$root/src"
mkdir -p "$root/src"
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$root/src"
else
  tar --exclude='./build' --exclude='./build-*' --exclude='./.git' -cf - . | tar -xf - -C "$root/src"
fi

in_root() { chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive /bin/bash -c "cd /src && $1"; }
in_root 'apt-get update -qq'
echo "--- Debian $(cat "$root/etc/debian_version"): scripts/test.sh"
in_root 'scripts/test.sh'
echo "--- Debian $(cat "$root/etc/debian_version"): scripts/run.sh --discover"
in_root 'scripts/run.sh --discover'
