#!/usr/bin/env sh
# A Debian base image made locally, for machines that cannot pull one from a registry (this project's CI and
# development machines): debootstrap a minimal bookworm with Python 3.11 and import it into Docker.
#   docker/make-base.sh [TAG]          (default shardwise-base:bookworm; needs root, debootstrap and a Docker engine)
# Then: make image BASE_IMAGE=shardwise-base:bookworm
set -eu
tag="${1:-shardwise-base:bookworm}"
rootfs="$(mktemp -d /tmp/shardwise-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" \
    http://deb.debian.org/debian
tar -C "$rootfs" -c . | docker import - "$tag"
echo "made $tag"
