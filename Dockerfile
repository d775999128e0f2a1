# fencegate container image.
#
#   docker build -t fencegate .
#   docker run --rm -p 8080:8080 -p 9901:9901 \
#       -v "$PWD/fencegate.toml:/etc/fencegate/fencegate.toml:ro" fencegate
#
# The mounted config must listen on 0.0.0.0 (see the README): the config baked
# into the image is the repository's reference config, which listens on
# 127.0.0.1 and is only reachable from inside the container.

# ---- build ------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /build
COPY . .
RUN cargo build --release --locked \
    && install -m 0755 target/release/fencegate /usr/local/bin/fencegate

# ---- run --------------------------------------------------------------------
FROM debian:bookworm-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# A fixed, non-root UID/GID so volume permissions and runAsNonRoot checks are
# predictable.
RUN groupadd --system --gid 10001 fencegate \
    && useradd --system --uid 10001 --gid fencegate \
        --home-dir /var/lib/fencegate --shell /usr/sbin/nologin fencegate \
    && install -d -o fencegate -g fencegate -m 0750 /var/lib/fencegate /var/lib/fencegate/data \
    && install -d -m 0755 /etc/fencegate

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
