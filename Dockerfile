# syntax=docker/dockerfile:1
# percolator: a static musl binary on a distroless base, running as non-root, for linux/amd64 and
# linux/arm64. BuildKit builds it (the cache mounts and $BUILDPLATFORM below need it):
#   scripts/build-image.sh                          this machine's platform, loaded into docker,
#                                                   tagged ghcr.io/une-tasse-de/percolator:<Cargo.toml version>
#   scripts/build-image.sh --platform linux/arm64   one platform, whichever the machine is
#   scripts/build-image.sh --platform linux/amd64,linux/arm64 --push
#                                                   both, as one multi-arch image, pushed
#   docker buildx build --platform linux/amd64,linux/arm64 -t IMAGE --push .   (the same by hand)
# tests/image.rs lays out the context this file's COPY lines take (after .dockerignore) and replays
# each architecture's cargo steps there offline, so that a manifest change the build cannot follow
# fails the test suite rather than the next image build.
#
# Cross-compiled, never emulated: the toolchain and build stages run on the builder's own platform
# ($BUILDPLATFORM) and compile for the target with cargo-zigbuild, zig being the C compiler (ring's
# and mimalloc's C code) and the linker against its own musl. An arm64 image builds on an amd64
# machine at native speed, with no QEMU or binfmt_misc. Only the runtime stage is of the target
# platform: `FROM build-${TARGETARCH}` picks the build stage of its architecture, and BuildKit
# builds only the stages the requested platforms need (the toolchain stage once for all of them).

# The toolchain is rust-toolchain.toml's channel, pinned to the patch release: this image's default
# toolchain is the one the tree pins (tests/image.rs checks that the tag and the channel agree).
# rust-toolchain.toml itself stays out of the context (.dockerignore): its components (rustfmt,
# clippy) are for development, and rustup would download them here. Debian rather than Alpine:
# PyPI's cargo-zigbuild wheels are built for glibc, so both tools install as prebuilt wheels.
# Both base images are pinned by the digest of their multi-arch index, the tag beside it saying
# which release that is: a tag can be pushed again, a digest cannot. Dependabot (docker) moves the
# digest when the tag is rebuilt, and tag and digest together to a new release.
FROM --platform=$BUILDPLATFORM rust:1.95.0-slim-trixie@sha256:e14e87345b4d5964ddcc3491d27ee046a0f23820f340c3c1e24da6880141f7c0 AS toolchain
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
# zig (the ziglang wheel: the official zig build, run as `python3 -m ziglang`, where cargo-zigbuild
# looks first) and cargo-zigbuild, pinned: wheels for x86_64 and aarch64 Linux, whichever the
# builder is. pip writes to /usr/local, not over Debian's own Python packages: this stage is
# thrown away, which is what --break-system-packages is about.
RUN pip install --no-cache-dir --break-system-packages ziglang==0.16.0 cargo-zigbuild==0.24.1
# The standard libraries of both targets (rustup's own downloads, for the pinned toolchain).
RUN rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl

# One build stage per architecture. The tree as it is: .dockerignore lets through exactly what
# cargo reads to build. The registry and target/ are cache mounts, kept by the builder between
# builds, one of each per target: the two builds of a multi-arch run go on at once, and cargo's
# lock on the registry lives outside the mount, so a shared registry could see two extract the
# same crate. A source edit recompiles percolator alone. target/ is not in the image layer: the
# binary is copied out in the same RUN. A *-linux-musl binary is static (crt-static is the musl
# targets' default), as distroless/static needs.
FROM toolchain AS build-amd64
WORKDIR /src
COPY . .
RUN --mount=type=cache,id=percolator-registry-x86_64-unknown-linux-musl,target=/usr/local/cargo/registry \
    --mount=type=cache,id=percolator-target-x86_64-unknown-linux-musl,target=/src/target,sharing=locked \
    cargo zigbuild --release --locked --bin percolator --target x86_64-unknown-linux-musl \
    && cp target/x86_64-unknown-linux-musl/release/percolator /percolator

FROM toolchain AS build-arm64
WORKDIR /src
COPY . .
RUN --mount=type=cache,id=percolator-registry-aarch64-unknown-linux-musl,target=/usr/local/cargo/registry \
    --mount=type=cache,id=percolator-target-aarch64-unknown-linux-musl,target=/src/target,sharing=locked \
    cargo zigbuild --release --locked --bin percolator --target aarch64-unknown-linux-musl \
    && cp target/aarch64-unknown-linux-musl/release/percolator /percolator

# TARGETARCH is BuildKit's (amd64, arm64) for the platform being built; it must keep no default
# here, or every platform would get the same binary.
FROM build-${TARGETARCH} AS build

# distroless/static: CA certificates and a nonroot user (65532), nothing else; of the target
# platform (no --platform).
FROM gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
# VERSION: scripts/build-image.sh and the release workflow pass Cargo.toml's version (a plain
# `docker build` says dev); REVISION the commit.
ARG VERSION=dev
ARG REVISION=
LABEL org.opencontainers.image.title="percolator" \
      org.opencontainers.image.source="https://github.com/une-tasse-de/percolator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /percolator /percolator
USER 65532:65532
# The root filesystem can be read-only: the only file percolator writes is the self-signed
# serving pair in --cert-dir (when no --tls-cert-file is given), whose default is relative to the
# working directory; /tmp is where the Deployment mounts an emptyDir (it passes
# --cert-dir=/tmp/certs). `docker run --read-only` needs `--tmpfs /tmp` likewise.
WORKDIR /tmp
# mimalloc returns the pages freed after a cache refresh to the system at once instead of when
# the allocator next works in the same place, which an idle server may never do: ~0.5 KiB per
# pod less at rest and a lower peak, for 10-20% more CPU per refresh (docs/benchmarks-history.md, issue 18,
# sixth step). Set MIMALLOC_PURGE_DELAY=10 in the Deployment for mimalloc's default.
ENV MIMALLOC_PURGE_DELAY=0
# percolator turns transparent huge pages off for itself (prctl PR_SET_THP_DISABLE): khugepaged
# collapsing its heap made resident memory creep up over hours (RELIABILITY.md, "Soak"). Set
# MIMALLOC_ALLOW_THP in the Deployment to leave it to mimalloc.
EXPOSE 10250
ENTRYPOINT ["/percolator"]
