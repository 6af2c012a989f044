# txmq broker image: `make docker-image` then `docker-compose up broker`, or by hand
# `docker build -t txmq .` and `docker run -p 10911:10911 -v txmq-data:/var/lib/txmq txmq`.
# The store lives on the /var/lib/txmq volume; the configuration is /etc/txmq/broker.toml
# (config/broker.toml of the repository).
#
# Nothing is pulled from a registry or a package index: the base is txmq-base:bookworm, a Debian
# bookworm root file system with python3 and venv built by tests/support/docker_base.sh (any
# image with Python 3.11 and venv will do, e.g. --build-arg BASE_IMAGE=python:3.11-slim), and
# the package comes as the wheels `make wheels` puts in build/wheels (txmq and its dependencies).
# `TXMQ_COMPILE=1 make docker-image` adds txmq's wheel with the request path compiled (mypyc),
# which pip takes over the pure one when its tag fits the image's Python (docs/performance.md).
ARG BASE_IMAGE=txmq-base:bookworm
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# An unprivileged user with a fixed uid, so volume ownership is predictable.
RUN groupadd --system --gid 10001 txmq \
 && useradd --system --uid 10001 --gid txmq --home-dir /var/lib/txmq --no-create-home \
        --shell /usr/sbin/nologin txmq

# Install the package into its own virtual environment from the wheels alone, with the gRPC
# front end (the SDK's optional Spark extras are not needed by the broker).
COPY build/wheels /tmp/wheels
RUN python3 -m venv /opt/txmq \
 && /opt/txmq/bin/pip install --no-index --find-links /tmp/wheels 'txmq[broker,grpc,cluster]' \
 && rm -rf /tmp/wheels
ENV PATH=/opt/txmq/bin:$PATH

COPY config/broker.toml /etc/txmq/broker.toml
# etcd for the compose file's cluster profile (the same image runs etcd members and brokers):
# Debian's etcd-server binary, as `make etcd` unpacks it.
COPY build/etcd/bin/etcd /usr/local/bin/etcd

# The data folder exists and belongs to txmq before VOLUME, so a fresh named volume inherits
# that ownership.
RUN mkdir -p /var/lib/txmq && chown txmq:txmq /var/lib/txmq
VOLUME ["/var/lib/txmq"]
WORKDIR /var/lib/txmq

# Listen on every interface inside the container (the default is loopback only), and serve the
# operations port (/metrics, /healthz, /readyz) on 9876.  TXMQ_CONFIG names the configuration
# file for `txmq probe`, which reads the broker's settings from it and the environment.
ENV TXMQ_BIND_ADDRESS=0.0.0.0 TXMQ_METRICS_PORT=9876 TXMQ_CONFIG=/etc/txmq/broker.toml

USER txmq
EXPOSE 10911 8081 9876

# `txmq probe ready` asks the operations port's /readyz: ready when this broker takes traffic
# (a single broker or leader that serves and accepts writes, an in-sync follower), with the
# reason when not; no credentials needed, whatever the ACL.  It reads the broker's configuration
# (TXMQ_CONFIG and the TXMQ_* environment) for the port and TLS: HTTPS when TLS is enforcing,
# presenting the broker's certificate under mutual TLS.  The start period leaves time for
# recovery after an unclean stop.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["txmq", "probe", "ready"]

# SIGTERM: stop accepting, finish in-flight requests, flush, close.
STOPSIGNAL SIGTERM
ENTRYPOINT ["txmq"]
CMD ["broker", "--config", "/etc/txmq/broker.toml"]
