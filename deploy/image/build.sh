#!/usr/bin/env bash
# Build the goose-ingest image without a Docker daemon or a registry (buildah/podman from Debian),
# as .ci/run does; docs/operations.md, "Building, running and deploying the image".
#
#   deploy/image/build.sh            # -> localhost/goose-ingest:ci (IMAGE=... to name it otherwise)
#
# The Dockerfile keeps `FROM python:3.11-slim` for everyone with a registry. Here that image
# cannot be pulled, so a stand-in is made once from Debian 12's packages (mmdebstrap + podman
# import; cached in podman's storage) and substituted in a copy of the Dockerfile: the runtime
# base has python3 (3.11), the builder's adds python3-dev (the slim image ships Python.h, Debian's
# python3 does not). `buildah bud --layers` reuses every unchanged step, so an unchanged tree
# costs seconds; --format docker keeps HEALTHCHECK (the OCI format drops it).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
IMAGE=${IMAGE:-localhost/goose-ingest:ci}
BASE=${BASE:-localhost/python-base:3.11-bookworm}
STATE=${GOOSE_IMAGE_STATE:-/var/tmp/goose-ingest-image}
mkdir -p "$STATE"

need=()
for tool in buildah podman runc mmdebstrap; do command -v "$tool" >/dev/null || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "build.sh: needs ${need[*]} (Debian/Ubuntu: apt-get install buildah podman runc mmdebstrap)" >&2
    exit 2
  fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah podman runc mmdebstrap
fi

# crun (podman's default) refuses this sandbox's cgroup layout; ulimits no higher than allowed here
if [ -z "${CONTAINERS_CONF:-}" ]; then
  nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=65536
  sed "s/@NOFILE@/$nofile/g" deploy/image/containers.conf > "$STATE/containers.conf"
  export CONTAINERS_CONF=$STATE/containers.conf
fi

make_base() {  # name, extra packages
  local name=$1 extra=$2
  podman image exists "$name" && return 0
  echo "build.sh: making base image $name from Debian 12 packages (once)" >&2
  mmdebstrap --quiet --variant=minbase \
    --include="python3,python3-venv,python-is-python3,ca-certificates${extra:+,$extra}" \
    bookworm "$STATE/rootfs.tar"
  podman import --change 'CMD ["python3"]' "$STATE/rootfs.tar" "$name" >/dev/null
  rm -f "$STATE/rootfs.tar"
}
make_base "$BASE" ""
make_base "$BASE-dev" "python3-dev"

sed -e "s#^FROM python:3.11-slim AS builder#FROM $BASE-dev AS builder#" \
    -e "s#^FROM python:3.11-slim\$#FROM $BASE#" Dockerfile > "$STATE/Dockerfile.local"
grep -q "^FROM $BASE-dev AS builder" "$STATE/Dockerfile.local" && grep -q "^FROM $BASE\$" "$STATE/Dockerfile.local" \
  || { echo "build.sh: the Dockerfile's FROM lines are not python:3.11-slim any more" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
revision=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
# the source: pyproject's [project.urls] (Source, then Repository, then Homepage), else the origin remote
source=$(python3 -c 'import tomllib
urls = tomllib.load(open("pyproject.toml", "rb")).get("project", {}).get("urls", {})
print(next((urls[k] for k in ("Source", "Repository", "Homepage") if k in urls), ""))' 2>/dev/null || true)
[ -n "$source" ] || source=$(git -C "$ROOT" remote get-url origin 2>/dev/null || echo unknown)
# pip in the RUN steps reaches the index through this machine's TLS-intercepting proxy: the host's
# CA bundle, mounted read-only for the build only (nothing of it lands in a layer)
buildah bud --quiet --format docker --isolation chroot --layers \
  -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" --build-arg SOURCE="$source" \
  -f "$STATE/Dockerfile.local" -t "$IMAGE" "$ROOT" >/dev/null
# The labels again, on the image itself: with --layers a tree whose build context did not change
# (a commit that touched only tests or docs) reuses every cached layer, the LABEL step's included,
# and the image would carry the revision of the build that made the cache. A metadata-only commit.
ctr=$(buildah from --quiet "$IMAGE")
buildah config --label org.opencontainers.image.revision="$revision" \
  --label org.opencontainers.image.version="$version" --label org.opencontainers.image.source="$source" "$ctr"
buildah commit --quiet --format docker --rm "$ctr" "$IMAGE" >/dev/null
echo "$IMAGE"
