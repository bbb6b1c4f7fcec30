#!/usr/bin/env bash
# Build the loraplane image (registry, gateway, agent, `db upgrade`, the setup Jobs) from the
# repository root. No image is published anywhere: build it, push it to your registry and point
# the Kustomize overlay's `images:` (or LORAPLANE_IMAGE for compose) at it.
#   deploy/build-image.sh                                           # loraplane:<version of pyproject.toml>
#   deploy/build-image.sh --push registry.example.com/acme/loraplane:0.1.0   # buildx, pushed
#   IMAGE=registry.example.com/acme/loraplane TAG=0.1.0 deploy/build-image.sh --push   (the same)
#   deploy/build-image.sh --platform linux/amd64,linux/arm64 --push REGISTRY/NAME:TAG
# Other arguments go to `docker build` (or `docker buildx build` when --platform/--push is given).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n 1)"
image="${IMAGE:-loraplane}"
tag="${TAG:-$version}"
build=(docker build)
extra=()
while (($#)); do
  case "$1" in
    --push)
      build=(docker buildx build)
      extra+=(--push)
      # --push REGISTRY/NAME[:TAG]: the reference to push (a tag-less one takes the version)
      if (($# > 1)) && [[ "$2" != -* ]]; then
        ref="$2"
        shift
        last="${ref##*/}"
        if [[ "$last" == *:* ]]; then
          image="${ref%:*}"
          tag="${ref##*:}"
        else
          image="$ref"
        fi
      fi
      ;;
    --platform*)
      build=(docker buildx build)
      extra+=("$1")
      ;;
    *) extra+=("$1") ;;
  esac
  shift
done
if [[ -z "$tag" ]]; then
  echo "build-image.sh: no version in pyproject.toml and no TAG given" >&2
  exit 2
fi
revision="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
set -x
"${build[@]}" \
  --file "$root/deploy/Dockerfile" \
  --tag "$image:$tag" \
  --label "org.opencontainers.image.version=$tag" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.source=loraplane" \
  "${extra[@]}" \
  "$root"
