#!/usr/bin/env bash
# Build the loraplane image (registry, gateway, agent, `db upgrade`) from the repository root.
#   deploy/build-image.sh                      # loraplane:<version from pyproject.toml>
#   IMAGE=ghcr.io/acme/loraplane deploy/build-image.sh --push
#   TAG=0.1.0-rc1 deploy/build-image.sh --platform linux/amd64,linux/arm64 --push   (buildx)
# Extra arguments go to `docker build` (or `docker buildx build` when --platform/--push is given).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n 1)"
image="${IMAGE:-loraplane}"
tag="${TAG:-$version}"
if [[ -z "$tag" ]]; then
  echo "build-image.sh: no version in pyproject.toml and no TAG given" >&2
  exit 2
fi
revision="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
build=(docker build)
for arg in "$@"; do
  case "$arg" in --platform*|--push) build=(docker buildx build) ;; esac
done
set -x
"${build[@]}" \
  --file "$root/deploy/Dockerfile" \
  --tag "$image:$tag" \
  --label "org.opencontainers.image.version=$tag" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.source=loraplane" \
  "$@" \
  "$root"
