# Cairn service image: the `cairn` CLI as entrypoint, `serve` as the default command, with the
# OpenAI-compatible, Anthropic and AWS (Bedrock) SDKs and OpenTelemetry (the openai, anthropic,
# bedrock and otel extras; tracing stays off until OTEL_TRACES_EXPORTER is set).
# Build: docker build -t cairn:local .   Run: see deploy/compose.yaml.
# Every dependency comes from requirements.lock (make lock): two builds of one commit install the
# same versions of the same files, whatever PyPI has published since.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/cairn
WORKDIR /src
# The dependencies first (their layer is reused until the lock changes): pinned, hash-checked.
COPY requirements.lock ./
RUN /opt/cairn/bin/pip install --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY service ./service
# Cairn itself, with its extras, and no index to fall back on: a requirement the lock lacks
# fails the build instead of being fetched unpinned.
RUN /opt/cairn/bin/pip wheel --no-deps --wheel-dir /tmp/dist . \
    && /opt/cairn/bin/pip install --no-index --find-links /tmp/dist "cairn[openai,anthropic,bedrock,otel]" \
    && /opt/cairn/bin/pip check

FROM python:3.11-slim
ENV PATH=/opt/cairn/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CAIRN_HEALTH_PORT=8080
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin cairn \
    && mkdir -p /var/lib/cairn/sessions && chown -R 10001:10001 /var/lib/cairn
COPY --from=build /opt/cairn /opt/cairn
# The local session store: a cache of the sessions topic, rebuilt from it when lost.
ENV CAIRN_SESSIONS__STORE_DIR=/var/lib/cairn/sessions
VOLUME /var/lib/cairn
USER 10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request as u; port = os.environ.get('CAIRN_HEALTH_PORT', '8080'); sys.exit(0 if u.urlopen(f'http://127.0.0.1:{port}/livez', timeout=2).status == 200 else 1)"]
# The service drains in-flight work on SIGTERM; the runtime's revoke grace must fit in the stop timeout.
STOPSIGNAL SIGTERM
ENTRYPOINT ["cairn"]
CMD ["serve"]
