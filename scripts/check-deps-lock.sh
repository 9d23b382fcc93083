#!/usr/bin/env bash
# scripts/deps.sh against a package manager that holds apt's locks, as unattended-upgrades does on
# a fresh VM: it must say it is waiting, then install once the lock is free; and give up with a
# clear line when the lock outlasts APT_LOCK_WAIT. Installs and removes Debian's tiny `hello`.
# Needs root (the locks are root's) and python3 (to hold an fcntl lock as apt does).
set -euo pipefail
cd "$(dirname "$0")/.."
lock=/var/lib/apt/lists/lock
hold_lock() {  # hold_lock SECONDS: in the background, holds $lock for that long
  python3 -c 'import fcntl, sys, time
f = open(sys.argv[1], "a"); fcntl.lockf(f, fcntl.LOCK_EX); print("held", flush=True)
time.sleep(float(sys.argv[2]))' "$lock" "$1" > /tmp/edgeaccel-lock-holder.out &
  holder=$!
  until grep -q held /tmp/edgeaccel-lock-holder.out 2>/dev/null; do sleep 0.1; done
}
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq hello > /dev/null 2>&1 || true
fail() { echo "check-deps-lock: $*"; exit 1; }

# Held longer than we may wait: a clear refusal, nothing installed.
hold_lock 8
if out=$(APT_LOCK_WAIT=2 scripts/deps.sh hello 2>&1); then fail "deps.sh succeeded under a held lock"; fi
grep -q "waiting for another package manager to finish: python3 (pid $holder) holds $lock" <<<"$out" ||
  fail "no waiting line: $out"
grep -q "gave up after 2 s: $lock is still held" <<<"$out" || fail "no give-up line: $out"
wait "$holder"

# Released while we wait: installed.
hold_lock 5
out=$(APT_LOCK_WAIT=60 scripts/deps.sh hello 2>&1) || fail "deps.sh failed after the lock was freed: $out"
wait "$holder"
grep -q "waiting for another package manager" <<<"$out" || fail "no waiting line: $out"
grep -q "the package locks are free after" <<<"$out" || fail "no going-on line: $out"
dpkg-query -W -f='${Status}' hello | grep -q "install ok installed" || fail "hello not installed"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq hello > /dev/null 2>&1
echo "check-deps-lock: deps.sh waits for a held apt lock and gives up clearly: ok"
