#!/usr/bin/env bash
# Prints the Debian packages that hold the shared libraries a binary needs (its DT_NEEDED
# entries, for any architecture dpkg knows), one per line, without the libc that every image
# has. The Dockerfiles install exactly these in the runtime image.
#   usage: scripts/runtime-packages.sh BINARY TRIPLET   (e.g. aarch64-linux-gnu)
set -euo pipefail
binary=${1:?usage: runtime-packages.sh BINARY TRIPLET}
triplet=${2:?usage: runtime-packages.sh BINARY TRIPLET}
objdump -p "$binary" | awk '$1 == "NEEDED" { print $2 }' | while read -r lib; do
  # dpkg knows a file by the path its package installed it under: /lib or /usr/lib.
  owner=""
  for dir in "/usr/lib/$triplet" "/lib/$triplet"; do
    owner=$(dpkg -S "$dir/$lib" 2>/dev/null | head -1 | cut -d: -f1) && break
  done
  [ -n "$owner" ] || { echo "runtime-packages.sh: no package holds $lib" >&2; exit 1; }
  echo "$owner"
done | grep -v -x -E 'libc6|libgcc-s1|libstdc\+\+6' | sort -u
