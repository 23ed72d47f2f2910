# syntax=docker/dockerfile:1
# goose-ingest worker image.
#   docker build -t goose-ingest .
#   docker run --rm -e GOOSE_INGEST_REDIS_URL=redis://redis:6379/0 -p 9464:9464 goose-ingest
# One process per container: each worker serves its own /metrics port. Scale with more
# containers / pods, never with `faststream run --workers N`.

############################ builder ############################
FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# 1. pinned runtime dependencies (binary wheels only)
COPY requirements.lock ./
RUN pip install --no-cache-dir --only-binary=:all: -r requirements.lock
# 2. a C compiler, in this stage only: the wheel below compiles the pure core with mypyc
#    (setup.py, services/native.py); the runtime stage gets the built modules, not the compiler
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
# 3. the project itself, as a wheel built here, installed without touching the pinned deps;
#    the build must have compiled the core (an image runs it compiled or not at all)
COPY pyproject.toml setup.py README.m[d] ./
COPY contracts ./contracts
COPY services ./services
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && pip install --no-cache-dir --no-deps /wheels/*.whl \
 && pip check \
 && cd / && python -c "from services.native import core_kind; k = core_kind(); assert k == 'compiled', k" \
 && goose-ingest --help >/dev/null

############################ runtime ############################
FROM python:3.11-slim
LABEL org.opencontainers.image.title="goose-ingest" \
      org.opencontainers.image.description="Telemetry pipeline for fleets of goose agents"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    GOOSE_INGEST_METRICS_HOST=0.0.0.0 \
    GOOSE_INGEST_METRICS_PORT=9464
# only the virtualenv; same base image, so its python symlinks resolve
COPY --from=builder /opt/venv /opt/venv
USER 10001:10001
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GOOSE_INGEST_METRICS_PORT', '9464'), timeout=2)"]
ENTRYPOINT ["goose-ingest"]
CMD ["worker"]
