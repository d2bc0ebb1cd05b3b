#!/usr/bin/env bash
# Build the offline Debian base image (debootstrap + docker import); no registry is contacted.
# Skips the build when the image already exists. Usage: scripts/build_base_image.sh [IMAGE]
set -euo pipefail
image=${1:-local/debian-py:bookworm}
if docker image inspect "$image" >/dev/null 2>&1; then
    echo "base image $image present; not rebuilding"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
mirror=$(apt-get indextargets --format '$(REPO_URI)' | grep -v security | sort -u | head -1)
rootfs=$(mktemp -d /tmp/gridbench-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap bookworm from $mirror (about a minute)"
debootstrap --variant=minbase --include=python3,libgomp1,libnuma1,ca-certificates bookworm "$rootfs" "$mirror" >/dev/null
tar -C "$rootfs" -c . | docker import - "$image" >/dev/null
echo "built $image"
