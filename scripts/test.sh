#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (as root: fixtures need mknod).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
if [ "$(id -u)" -ne 0 ]; then
  exec sudo ctest --test-dir build --output-on-failure -j"$(nproc)"
fi
exec ctest --test-dir build --output-on-failure -j"$(nproc)"
