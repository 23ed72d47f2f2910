# syntax=docker/dockerfile:1
# goose-ingest: one image for every command (worker, export otlp|postgres, tail, replay,
# import-sessions, acl ...); the command is the container's arguments.
#   docker build -t goose-ingest --build-arg VERSION=$(git describe --always) --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg SOURCE=$(git remote get-url origin) .
#   docker run --rm -e GOOSE_INGEST_REDIS_URL=redis://redis:6379/0 -p 9464:9464 goose-ingest            # a worker
#   docker run --rm -e GOOSE_INGEST_REDIS_URL=... goose-ingest export otlp
# One process per container: each serves its own /metrics port. Scale with more containers /
# pods, never with `faststream run --workers N`. On machines without a Docker daemon:
# deploy/image/build.sh (buildah/podman; docs/operations.md, "Building, running and deploying the image").

############################ builder ############################
FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
# a C compiler, in this stage only: the wheel below compiles the pure core with mypyc (setup.py,
# services/native.py); tini, the runtime's PID 1 (copied as its static build)
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev tini \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv && python -m venv /opt/build
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# 1. exactly the pinned runtime dependencies (binary wheels only), then the pinned build
#    requirements in a venv of their own (not shipped)
COPY requirements.lock requirements-build.lock ./
RUN pip install --no-cache-dir --only-binary=:all: --no-deps -r requirements.lock \
 && /opt/build/bin/pip install --no-cache-dir --only-binary=:all: --no-deps -r requirements-build.lock
# 2. the project itself, as a wheel built with those build requirements (no isolation: nothing is
#    resolved here), installed without touching the pinned deps; `pip check` fails when the lock
#    misses a dependency
COPY pyproject.toml setup.py README.m[d] ./
COPY contracts ./contracts
COPY services ./services
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels . \
 && pip install --no-cache-dir --no-deps /wheels/*.whl \
 && pip check
# 3. the venv slimmed (292 -> ~160 MB): pyarrow's Flight, Substrait, S3 and C++ parts, debug symbols,
#    pip and setuptools (deploy/image/slim-venv.sh says why each may go). Then the checks run on what
#    ships: the core is the compiled one (an image runs it compiled or not at all), the CLI loads,
#    the archive's Parquet writer and obstore import.
COPY deploy/image/slim-venv.sh /usr/local/bin/
RUN slim-venv.sh /opt/venv \
 && cd / && python -c "from services.native import core_kind; k = core_kind(); assert k == 'compiled', k" \
 && python -c "import pyarrow.parquet, pyarrow.compute, obstore.store, zstandard.backend_c, services.archive.command" \
 && goose-ingest --help >/dev/null

############################ runtime ############################
FROM python:3.11-slim
ARG VERSION=unknown
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="goose-ingest" \
      org.opencontainers.image.description="Telemetry pipeline for fleets of goose agents" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    GOOSE_INGEST_METRICS_HOST=0.0.0.0 \
    GOOSE_INGEST_METRICS_PORT=9464 \
    GOOSE_INGEST_METRICS_PORT_FILE=/tmp/goose-ingest-metrics.port
# only the virtualenv and tini; same base image, so the venv's python symlinks resolve
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /usr/bin/tini-static /usr/local/bin/tini
USER 10001:10001
EXPOSE 9464 8080
# /healthz on the port the process bound (its port file; GOOSE_INGEST_METRICS_PORT without one):
# right with --metrics-port and port 0 too. Served from the first second, broker or not.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-m", "services.metrics.healthcheck"]
# tini as PID 1: signals get their default actions and are forwarded to goose-ingest, which stops
# with exit 0 on SIGTERM/SIGINT in every state (services/metrics/startup.py); zombies are reaped.
# A SIGTERM in the first second, before Python has installed any handler, ends the process by the
# signal's default action (128 + 15): `-e 143` reports that requested stop as 0 too.
ENTRYPOINT ["tini", "-e", "143", "--", "goose-ingest"]
CMD ["worker"]
