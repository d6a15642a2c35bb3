# syntax=docker/dockerfile:1
# percolator: a static binary on a distroless base, running as non-root.
#   docker build -t percolator:dev .
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock rust-toolchain.toml ./
RUN mkdir -p src/bin && echo 'fn main() {}' > src/main.rs && echo 'fn main() {}' > src/bin/percolator-sim.rs \
    && touch src/lib.rs && cargo fetch --locked
COPY src ./src
RUN cargo build --release --locked --bin percolator \
    && cp target/release/percolator /percolator

# distroless/static: CA certificates and a nonroot user (65532), nothing else.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /percolator /percolator
USER 65532:65532
# mimalloc returns the pages freed after a cache refresh to the system at once instead of when
# the allocator next works in the same place, which an idle server may never do: ~0.5 KiB per
# pod less at rest and a lower peak, for 10-20% more CPU per refresh (BENCHMARKS.md, issue 18,
# sixth step). Set MIMALLOC_PURGE_DELAY=10 in the Deployment for mimalloc's default.
ENV MIMALLOC_PURGE_DELAY=0
EXPOSE 10250
ENTRYPOINT ["/percolator"]
