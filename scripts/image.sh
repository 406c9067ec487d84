#!/usr/bin/env bash
# Build orch's container image (docker/Dockerfile): orch's wheels on this machine, then the image.
#
#   scripts/image.sh [TAG]          default TAG localhost/orch:latest
#   env: ENGINE (podman|docker, default podman), BASE (the Dockerfile's base image; default: a Debian
#        bookworm minbase made here with mmdebstrap and kept as localhost/orch-base:bookworm)
#
# Facts of these machines (issue 29): no image registry is reachable, so the default base is made from
# Debian packages (about 90 s, once: later runs reuse the image podman keeps); crun fails here (rlimits,
# cgroup v1 hybrid), so podman runs with runc and a containers.conf without default ulimits.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-localhost/orch:latest}
ENGINE=${ENGINE:-podman}
DEFAULT_BASE=localhost/orch-base:bookworm
BASE=${BASE:-$DEFAULT_BASE}
PYTHON=${PYTHON:-python3}

engine() {
  if [ "$ENGINE" = podman ]; then
    CONTAINERS_CONF="$PWD/docker/containers.conf" podman --runtime runc "$@"
  else
    "$ENGINE" "$@"
  fi
}

if [ "$BASE" = "$DEFAULT_BASE" ] && ! engine image exists "$BASE" 2>/dev/null; then
  echo "== image: making the base $BASE from Debian packages (mmdebstrap, once)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,openssh-client,ca-certificates \
    bookworm "$tmp/base.tar"
  engine import -q "$tmp/base.tar" "$BASE" >/dev/null
fi

echo "== image: orch's wheels (build/wheels)"
rm -rf build/wheels
"$PYTHON" -m pip wheel -q --disable-pip-version-check -w build/wheels . 2>&1 | grep -v '^WARNING: Location' || true
ls build/wheels/orch-*.whl >/dev/null

echo "== image: building $TAG on $BASE"
engine build -q --build-arg "BASE=$BASE" -f docker/Dockerfile -t "$TAG" . >/dev/null
size=$(engine image inspect --format '{{.Size}}' "$TAG")
echo "== image: $TAG, $((size / 1000000)) MB"
