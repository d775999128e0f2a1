# fencegate container image.
#
#   docker build -t fencegate .
#   docker run --rm -p 8080:8080 -p 9901:9901 \
#       -v "$PWD/fencegate.toml:/etc/fencegate/fencegate.toml:ro" fencegate
#
# The mounted config must listen on 0.0.0.0 (see the README): the config baked
# into the image is the repository's reference config, which listens on
# 127.0.0.1 and is only reachable from inside the container.
#
# The image runs as a non-root user (UID/GID 10001) and works with a read-only
# root filesystem: fencegate writes only to its fence store, under
# /var/lib/fencegate/data (a volume; keep it across containers):
#
#   docker run --rm --read-only -p 8080:8080 -p 127.0.0.1:9901:9901 \
#       -v fencegate-data:/var/lib/fencegate/data \
#       -v "$PWD/fencegate.toml:/etc/fencegate/fencegate.toml:ro" fencegate
#
# Kubernetes manifests that use this image: config/kubernetes/.

# ---- build ------------------------------------------------------------------
# The toolchain is the crate's rust-version (Cargo.toml), so the image is built
# the same way every time; raise both together (.ci/deploy-lint checks it).
ARG RUST_VERSION=1.91
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
COPY Cargo.toml Cargo.lock ./
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
COPY config/fencegate.toml /etc/fencegate/fencegate.toml

ENV FENCEGATE_CONFIG=/etc/fencegate/fencegate.toml
# The durable fence store keeps data/fences relative to the working directory:
# mount a volume on /var/lib/fencegate/data to keep fences across containers.
WORKDIR /var/lib/fencegate
VOLUME /var/lib/fencegate/data
USER 10001:10001

# 8080: proxy. 9901: admin (/healthz, /readyz, /metrics, /fences).
EXPOSE 8080 9901
# fencegate drains in-flight requests on SIGTERM for [server] shutdown_grace
# (default 30s): give `docker stop` a longer timeout (-t) than that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/fencegate"]
