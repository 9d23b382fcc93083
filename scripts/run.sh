#!/usr/bin/env bash
# Installs what is missing, builds, and runs the daemon in the foreground (as root: it serves
# sockets in the kubelet's directory). Extra arguments go to the daemon, e.g. --discover.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh edgeaccel-device-plugin
if [ "$(id -u)" -ne 0 ]; then
  exec sudo build/edgeaccel-device-plugin "$@"
fi
exec build/edgeaccel-device-plugin "$@"
