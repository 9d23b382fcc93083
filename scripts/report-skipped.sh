#!/usr/bin/env bash
# Prints how many test cases the last ctest run in build dir $1 (default build/) skipped, and why
# (the GTEST_SKIP message of each): a skip is a check that did not run on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
log=${1:-build}/Testing/Temporary/LastTest.log
[ -r "$log" ] || { echo "report-skipped: no $log"; exit 0; }
awk '
  /^[0-9]+\/[0-9]+ Testing: / { name = $3; reason = ""; next }
  /: Skipped$/ { getline reason; next }
  /^Skip regular expression found in output/ {
    skipped[++n] = name ": " (reason == "" ? "(no reason given)" : reason)
  }
  END {
    printf "%d test case(s) skipped%s\n", n, (n ? ":" : "")
    for (i = 1; i <= n; i++) print "  " skipped[i]
  }' "$log"
