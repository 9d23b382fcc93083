#!/usr/bin/env bash
# Installs what building edgeaccel needs, from Debian 12's own packages, if it is missing.
# Extra package names given as arguments are installed too (e.g. the fuzzing toolchain).
#
# Another apt or dpkg may hold the package locks: a fresh cloud VM runs unattended-upgrades at
# first boot, for minutes. Then this waits (saying so, and for whom) rather than failing, up to
# APT_LOCK_WAIT seconds (default 900).
set -euo pipefail
packages=(cmake g++ make pkg-config protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
          libgrpc++-dev libabsl-dev libgoogle-glog-dev libgtest-dev libgmock-dev
          libcpp-httplib-dev libssl-dev libmbedtls-dev nlohmann-json3-dev libyaml-cpp-dev openssl
          prometheus strace "$@")
lock_wait=${APT_LOCK_WAIT:-900}
# apt's own wait (DPkg::Lock::Timeout) covers the dpkg locks that install takes; apt-get update
# takes the lists lock and fails at once, so wait for every lock here first.
apt_locks=(/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock
           /var/cache/apt/archives/lock)

# The pid holding a POSIX lock on $1 (apt and dpkg take fcntl locks), from /proc/locks, whose
# lines read "1: POSIX ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF" (hex device numbers;
# "1: -> ..." lines are waiters, not holders).
lock_holder() {
  local dev_inode major minor inode
  dev_inode=$(stat -c '%Hd %Ld %i' "$1" 2>/dev/null) || return 0
  read -r major minor inode <<<"$dev_inode"
  awk -v id="$(printf '%02x:%02x:%s' "$major" "$minor" "$inode")" \
    '$2 != "->" && $6 == id { print $5; exit }' /proc/locks 2>/dev/null || true
}

wait_for_apt_locks() {
  local start=$SECONDS lock pid said=""
  for lock in "${apt_locks[@]}"; do
    while pid=$(lock_holder "$lock"); [ -n "$pid" ]; do
      if [ -z "$said" ]; then
        echo "waiting for another package manager to finish: $(cat "/proc/$pid/comm" 2>/dev/null ||
          echo unknown) (pid $pid) holds $lock (a new VM runs unattended-upgrades at first" \
          "boot); waiting up to ${lock_wait} s"
        said=yes
      fi
      if ((SECONDS - start >= lock_wait)); then
        echo "gave up after ${lock_wait} s: $lock is still held by pid $pid; run this again once" \
          "it has finished (or set APT_LOCK_WAIT)" >&2
        return 1
      fi
      sleep 2
    done
  done
  [ -z "$said" ] || echo "the package locks are free after $((SECONDS - start)) s; going on"
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  wait_for_apt_locks
  $sudo apt-get -o DPkg::Lock::Timeout="$lock_wait" update -qq
  wait_for_apt_locks
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout="$lock_wait" install -y -qq \
    --no-install-recommends "${missing[@]}"
fi
