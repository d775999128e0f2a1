# fencegate container image.
#
#   docker build -t fencegate .
#   docker run --rm -p 8080:8080 -p 127.0.0.1:9901:9901 \
#       -v fencegate-data:/var/lib/fencegate/data fencegate
#
# The config baked in is config/container.toml: both listeners on 0.0.0.0 (the
# proxy on 8080, the admin API on 9901), fences in the file store on the data
# volume, fence changes refused until an admin token is supplied (the file
# says how), and one route to a store on the container's loopback interface.
# Mount your own config over /etc/fencegate/fencegate.toml for your routes:
#
#   docker run --rm -v "$PWD/fencegate.toml:/etc/fencegate/fencegate.toml:ro" fencegate --check
#
# The image runs as a non-root user (UID/GID 10001) and works with a read-only
# root filesystem (`docker run --read-only`): fencegate writes only to its
# fence store, under /var/lib/fencegate/data (a volume; keep it across
# containers).
#
# Labels: the version is Cargo.toml's (.ci/deploy-lint checks it); the source
# repository's address and the commit come from the build:
#
#   docker build --build-arg SOURCE=https://example.com/your/fencegate \
#       --build-arg REVISION="$(git rev-parse HEAD)" -t fencegate .
#
# Kubernetes manifests that use this image: config/kubernetes/ (see
# docs/kubernetes.md).

# ---- build ------------------------------------------------------------------
# The toolchain is the one fencegate's optimization profile was made with
# (benches/pgo/toolchain.txt), so the image is built the same way every time
# and with the profile (benches/pgo/rustc-wrapper applies it only with that
# toolchain's LLVM); .ci/deploy-lint checks it, and that it is no older than
# Cargo.toml's rust-version.
ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS builder
# A pipe in a RUN fails the step when any of its commands fails.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /build

# Strip debug info from the binary: the release profile keeps line tables
# (debug = "line-tables-only") for profiling from a checkout, which an image
# does not need. Symbols stay, so a backtrace still names its functions.
# Set before the dependency build: profile settings are part of every unit's
# fingerprint, and a change would rebuild the dependencies.
ENV CARGO_PROFILE_RELEASE_STRIP=debuginfo \
    CARGO_TERM_COLOR=never

# Dependencies first, in a layer of their own that only a change of Cargo.toml
# or Cargo.lock rebuilds: build them against stub sources. Cargo reads every
# target the manifest declares, so each [[bench]] gets a stub too (examples and
# tests are found by directory and need none).
# The etcd store's client compiles etcd's protobuf files at build time. Not
# pinned (DL3008): the builder's protoc only reads etcd's .proto files, and
# its output is checked by the compiler.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock ./
# The rustc wrapper and the profile it compiles every crate with
# (profile-guided optimization; benches/README.md), dependencies included.
COPY .cargo ./.cargo
COPY benches/pgo ./benches/pgo
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && awk '/^\[\[bench\]\]/ { bench = 1; next } /^\[/ { bench = 0 } bench && $1 == "name" { gsub(/"/, "", $3); print $3 }' Cargo.toml \
        | while read -r name; do echo 'fn main() {}' > "benches/$name.rs"; done \
    && cargo build --release --locked --bin fencegate

# Then fencegate itself. The binary needs src/ only; forget the stub's build so
# the real sources are compiled whatever their timestamps.
COPY src ./src
RUN cargo clean --release --package fencegate \
    && cargo build --release --locked --bin fencegate \
    && install -m 0755 target/release/fencegate /usr/local/bin/fencegate

# ---- run --------------------------------------------------------------------
# Debian's slim image of the same release the builder is on (same glibc). The
# tag follows Debian's point releases, so a rebuild picks up security fixes.
FROM debian:bookworm-slim

# The platform's root certificates (ca-certificates): an https:// upstream
# without a ca_file is verified against them. Not pinned (DL3008): the bundle
# must follow Debian's updates (a root removed or distrusted), and Debian
# replaces the version at each point release, which would break a pinned build.
# A fixed, non-root UID/GID so volume permissions and runAsNonRoot checks are
# predictable (the Kubernetes manifests use the same numbers). Only the data
# directory is the user's: nothing else needs writing.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 fencegate \
    && useradd --system --uid 10001 --gid fencegate \
        --home-dir /var/lib/fencegate --no-create-home --shell /usr/sbin/nologin fencegate \
    && install -d -m 0755 /var/lib/fencegate /etc/fencegate \
    && install -d -o fencegate -g fencegate -m 0750 /var/lib/fencegate/data

COPY --from=builder /usr/local/bin/fencegate /usr/local/bin/fencegate
# Listens on 0.0.0.0 (config/container.toml); mount a config of your own
# over it for your routes.
COPY config/container.toml /etc/fencegate/fencegate.toml

ENV FENCEGATE_CONFIG=/etc/fencegate/fencegate.toml
# The fence store is under /var/lib/fencegate/data (config/container.toml's
# [fences] path; a config that leaves the default, data/fences, lands there
# too): mount a volume on it to keep fences across containers.
WORKDIR /var/lib/fencegate
VOLUME /var/lib/fencegate/data
USER 10001:10001

# 8080: proxy. 9901: admin (/healthz, /readyz, /metrics, /fences).
EXPOSE 8080 9901
# fencegate drains in-flight requests on SIGTERM for [server] shutdown_grace
# (default 30s): give `docker stop` a longer timeout (-t) than that.
STOPSIGNAL SIGTERM

# OCI image labels (org.opencontainers.image.*): what `docker inspect` and
# registries show. VERSION is Cargo.toml's version; SOURCE and REVISION are
# empty unless the build passes them. Last, so a new REVISION rebuilds no
# layer above.
ARG VERSION=0.2.0
ARG SOURCE=""
ARG REVISION=""
LABEL org.opencontainers.image.title="fencegate" \
      org.opencontainers.image.description="An HTTP reverse proxy that enforces fencing tokens in front of upstreams that cannot check them" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}"

ENTRYPOINT ["/usr/local/bin/fencegate"]
