#!/usr/bin/env bash
# Builds the container image from ./Dockerfile with docker (buildx when available), podman or
# buildah, tagged with Cargo.toml's version, for one platform or several (linux/amd64,linux/arm64:
# cross-compiled on the machine's own platform, no emulation). tests/image.rs checks the
# Dockerfile's build on every test run without an engine; this script is the real build, where the
# base images can be pulled. The release workflow (.github/workflows/release.yml) builds the same
# way, with the same build arguments.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
Usage: scripts/build-image.sh [options] [-- extra build arguments]

Builds ./Dockerfile into IMAGE:TAG.

Options:
  --image NAME       repository (default ghcr.io/une-tasse-de/percolator; env IMAGE)
  --tag TAG          tag (default: Cargo.toml's version; env TAG)
  --platform LIST    e.g. linux/amd64 or linux/amd64,linux/arm64 (default: the engine's own;
                     env PLATFORM). Several platforms make a multi-arch image: with docker
                     this needs buildx, --push and a builder that builds several platforms
                     (`docker buildx create --use`, or Docker's containerd image store);
                     with podman/buildah a manifest list.
  --push             push IMAGE:TAG once built (env PUSH=1)
  --engine ENGINE    docker, podman or buildah (default: the first found, in that order;
                     env ENGINE)
  --dry-run          print the commands instead of running them
  -h, --help         this help

Examples:
  scripts/build-image.sh
  scripts/build-image.sh --image registry.example.com/percolator --push
  scripts/build-image.sh --platform linux/amd64,linux/arm64 --push
  scripts/build-image.sh --engine podman --platform linux/amd64,linux/arm64 --push

Every platform builds at native speed on this machine: the Dockerfile's build stages run on the
machine's own platform and cross-compile for each target (cargo-zigbuild), so no QEMU or
binfmt_misc is needed; see the comment at the top of the Dockerfile.
EOF
}

die() {
  echo "build-image.sh: $*" >&2
  exit 1
}

image="${IMAGE:-ghcr.io/une-tasse-de/percolator}"
tag="${TAG:-}"
platform="${PLATFORM:-}"
push="${PUSH:-0}"
engine="${ENGINE:-}"
dry_run=0
extra=()

while [ $# -gt 0 ]; do
  case "$1" in
    --image) [ $# -ge 2 ] || die "--image needs a value"; image="$2"; shift 2 ;;
    --image=*) image="${1#*=}"; shift ;;
    --tag) [ $# -ge 2 ] || die "--tag needs a value"; tag="$2"; shift 2 ;;
    --tag=*) tag="${1#*=}"; shift ;;
    --platform) [ $# -ge 2 ] || die "--platform needs a value"; platform="$2"; shift 2 ;;
    --platform=*) platform="${1#*=}"; shift ;;
    --engine) [ $# -ge 2 ] || die "--engine needs a value"; engine="$2"; shift 2 ;;
    --engine=*) engine="${1#*=}"; shift ;;
    --push) push=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

# The workspace's version ([workspace.package] in Cargo.toml, which every crate inherits): the
# image tag and the version label.
version="$(awk '
  /^\[/ { in_package = ($0 == "[workspace.package]") }
  in_package && $1 == "version" { gsub(/^[^"]*"|".*$/, ""); print; exit }
' Cargo.toml)"
[ -n "$version" ] || die "no version in Cargo.toml's [workspace.package]"
tag="${tag:-$version}"
ref="$image:$tag"
revision="$(git rev-parse --verify HEAD 2>/dev/null || true)"

if [ -z "$engine" ]; then
  for candidate in docker podman buildah; do
    if command -v "$candidate" >/dev/null 2>&1; then
      engine="$candidate"
      break
    fi
  done
  [ -n "$engine" ] || die "no container engine found: install docker (with buildx), podman or buildah, or set ENGINE"
elif ! command -v "$engine" >/dev/null 2>&1; then
  die "$engine: not found"
fi

multi=0
case "$platform" in *,*) multi=1 ;; esac

run() {
  echo "+ $*" >&2
  if [ "$dry_run" = 0 ]; then
    "$@"
  fi
}

build_args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision")

case "$engine" in
  docker)
    if docker buildx version >/dev/null 2>&1; then
      args=(buildx build --file Dockerfile --tag "$ref" "${build_args[@]}")
      [ -z "$platform" ] || args+=(--platform "$platform")
      if [ "$push" = 1 ]; then
        args+=(--push)
      elif [ "$multi" = 1 ]; then
        case " ${extra[*]} " in
          *" --output"* | *" -o "*) ;;
          *) die "a multi-platform image ($platform) leaves buildx only by --push (or an --output after --)" ;;
        esac
      else
        args+=(--load)
      fi
      run docker "${args[@]}" ${extra[@]+"${extra[@]}"} .
    else
      # The Dockerfile's cache mounts need BuildKit; the classic builder has no --platform list.
      [ "$multi" = 0 ] || die "docker without buildx builds one platform: install buildx, or use podman"
      args=(build --file Dockerfile --tag "$ref" "${build_args[@]}")
      [ -z "$platform" ] || args+=(--platform "$platform")
      run env DOCKER_BUILDKIT=1 docker "${args[@]}" ${extra[@]+"${extra[@]}"} .
      [ "$push" = 0 ] || run docker push "$ref"
    fi
    ;;
  podman | buildah)
    args=(build --file Dockerfile "${build_args[@]}")
    if [ "$multi" = 1 ]; then
      # One image per platform, gathered in a manifest list named $ref (a list left by an
      # earlier run would keep its old images: removed first).
      if [ "$dry_run" = 0 ]; then
        "$engine" manifest rm "$ref" >/dev/null 2>&1 || true
      fi
      args+=(--platform "$platform" --manifest "$ref")
    else
      [ -z "$platform" ] || args+=(--platform "$platform")
      args+=(--tag "$ref")
    fi
    run "$engine" "${args[@]}" ${extra[@]+"${extra[@]}"} .
    if [ "$push" = 1 ]; then
      if [ "$multi" = 1 ]; then
        run "$engine" manifest push --all "$ref" "docker://$ref"
      else
        run "$engine" push "$ref"
      fi
    fi
    ;;
  *) die "unknown engine $engine (docker, podman or buildah)" ;;
esac

if [ "$dry_run" = 0 ]; then
  if [ "$push" = 1 ]; then echo "built and pushed $ref" >&2; else echo "built $ref" >&2; fi
fi
