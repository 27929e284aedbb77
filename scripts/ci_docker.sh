#!/usr/bin/env bash
# CI's Docker engine and the CPU image, for the tests that run the pipeline's steps in containers
# (tests/e2e/test_pipeline_containers.py, tests/integration/test_image.py; docs/deploy.md, "The pipeline in
# containers"). A machine that cannot have them says so in one line and those tests skip; the rest of CI goes on.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! docker info >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "ci: no Docker engine, and no root or apt-get to install one: the container tests skip" >&2; exit 1
    fi
    command -v dockerd >/dev/null || { apt-get update -qq && apt-get install -y -qq docker.io; } >/dev/null
    nohup dockerd >/tmp/dockerd.log 2>&1 &
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "ci: dockerd did not start (/tmp/dockerd.log)" >&2; exit 1; }
fi
if ! docker image inspect shardwise-base:bookworm >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; } >/dev/null
    make base-image >/dev/null
fi
make image-cpu BASE_IMAGE=shardwise-base:bookworm >/dev/null
echo "ci: Docker engine up, $(docker image inspect --format '{{index .RepoTags 0}}' ghcr.io/shardwise/shardwise:0.1.0-cpu) built"
