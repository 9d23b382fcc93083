#!/usr/bin/env bash
# Installs what building edgeaccel needs, from Debian 12's own packages, if it is missing.
# Extra package names given as arguments are installed too (e.g. the fuzzing toolchain).
set -euo pipefail
packages=(cmake g++ make pkg-config protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
          libgrpc++-dev libabsl-dev libgoogle-glog-dev libgtest-dev libgmock-dev
          libcpp-httplib-dev libssl-dev nlohmann-json3-dev libyaml-cpp-dev openssl prometheus "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
