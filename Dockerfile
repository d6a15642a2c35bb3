# syntax=docker/dockerfile:1
# percolator: a static musl binary on a distroless base, running as non-root.
#   scripts/build-image.sh                 (tags ghcr.io/une-tasse-de/percolator:<Cargo.toml version>)
#   docker build -t percolator:dev .       (BuildKit: the cache mounts below need it)
# tests/image.rs lays out the context this file's COPY lines take (after .dockerignore) and runs
# its cargo commands there offline, so that a manifest change the build cannot follow fails the
# test suite rather than the next image build.
#
# Multi-arch: nothing here names an architecture. rust:*-alpine is itself a multi-arch image, and
# cargo builds for the platform it runs on (x86_64- or aarch64-unknown-linux-musl), so
#   docker buildx build --platform linux/amd64,linux/arm64 -t IMAGE --push .
# (or scripts/build-image.sh --platform linux/amd64,linux/arm64 --push) runs the build stage once
# per target platform: natively on a builder node of that platform, otherwise under QEMU
# emulation (binfmt_misc, e.g. `docker run --privileged --rm tonistiigi/binfmt --install arm64`),
# which is correct but several times slower.

# The toolchain is rust-toolchain.toml's channel, pinned to the patch release: this image's
# default toolchain is the one the tree pins (tests/image.rs checks that the tag and the channel
# agree). rust-toolchain.toml itself stays out of the context (.dockerignore): its components
# (rustfmt, clippy) are for development, and rustup would download them here.
FROM rust:1.95.0-alpine AS build
# musl-dev: the C runtime that ring and mimalloc's C code link against (gcc is in the image;
# named so that the build does not depend on it staying there).
RUN apk add --no-cache musl-dev gcc
WORKDIR /src
# The tree as it is: .dockerignore lets through exactly what cargo reads to build.
COPY . .
# The registry and target/ are cache mounts, kept by the builder between builds, one of each
# per platform: the builds of a multi-arch run go on at once, and cargo's lock on the registry
# lives outside the mount, so a shared registry could see two extract the same crate. A source
# edit recompiles percolator alone. target/ is not in the image
# layer: the binary is copied out in the same RUN. A *-linux-musl binary is static (crt-static
# is the musl targets' default), as distroless/static needs.
ARG TARGETPLATFORM
RUN --mount=type=cache,id=percolator-registry-$TARGETPLATFORM,target=/usr/local/cargo/registry \
    --mount=type=cache,id=percolator-target-$TARGETPLATFORM,target=/src/target,sharing=locked \
    cargo build --release --locked --bin percolator \
    && cp target/release/percolator /percolator

# distroless/static: CA certificates and a nonroot user (65532), nothing else.
FROM gcr.io/distroless/static-debian12:nonroot
# VERSION: scripts/build-image.sh passes Cargo.toml's version (a plain `docker build` says dev).
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
