#!/usr/bin/env bash
# Makes a local debian:<suite>-slim-like base image for one architecture from Debian's mirror,
# with debootstrap (no container registry needed), and imports it into podman's storage as
# localhost/debian-<suite>-slim:<arch> (suite: bookworm, Debian 12, the default; or trixie,
# Debian 13). Slimmed the way Debian's official slim images are:
# no docs, man pages, locales or apt lists. Foreign architectures need qemu-user-static.
#   usage: scripts/make-base-image.sh amd64|arm64 [bookworm|trixie] [mirror]
set -euo pipefail
arch=${1:?usage: make-base-image.sh amd64|arm64 [bookworm|trixie] [mirror]}
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}
image="localhost/debian-${suite}-slim:${arch}"
if podman image exists "$image"; then
  echo "$image: already made"
  exit 0
fi
root=$(mktemp -d "/var/tmp/edgeaccel-rootfs-${arch}.XXXXXX")
trap 'rm -rf "$root"' EXIT
# What Debian's slim images leave out (debuerreotype's slimify list, shortened).
mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
cat > "$root/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
CFG
start=$SECONDS
debootstrap --variant=minbase --arch="$arch" "$suite" "$root" "$mirror" \
  > "$root.log" 2>&1 || { tail -30 "$root.log"; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
cat > "$root/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
echo 'Acquire::Languages "none";' > "$root/etc/apt/apt.conf.d/docker-no-languages"
echo 'APT::Install-Recommends "false";' > "$root/etc/apt/apt.conf.d/docker-no-recommends"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/*.log \
       "$root"/usr/share/doc/*/[!c]* "$root"/usr/share/man/* "$root"/usr/share/locale/* \
       "$root"/usr/share/info/*
find "$root/usr/share/doc" -mindepth 1 -maxdepth 1 -type d -empty -delete 2>/dev/null || true
: > "$root/etc/resolv.conf"
: > "$root/etc/hostname"
tar -C "$root" --numeric-owner -c . |
  podman import --quiet --arch "$arch" --os linux --change 'CMD ["bash"]' - "$image" > /dev/null
echo "$image: made in $((SECONDS - start)) s, $(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=iec) uncompressed"
