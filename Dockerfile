# The sampling service as a container: `cvae serve` with one worker per core, reading the
# checkpoint directory mounted at /checkpoints (read-only is enough: the service never writes
# there). Several replicas may mount the same directory; each moves to the newest step within
# its poll interval. Build and run (not run on the project's machine, which has no Docker
# engine; see docs/service-deployment.md):
#
#   docker build -t cvae-serve .
#   docker run -p 8000:8000 -v "$PWD/checkpoints:/checkpoints:ro" cvae-serve
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY cvae ./cvae
COPY service ./service
RUN pip install . && useradd --system --no-create-home cvae
USER cvae

EXPOSE 8000
# /healthz: the process answers; /readyz: a checkpoint is loaded and compiled.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
    CMD python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"
# SIGTERM (docker stop, Kubernetes) drains in-flight requests and exits 0.
STOPSIGNAL SIGTERM
CMD ["cvae", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "auto", \
     "--checkpoint-dir", "/checkpoints", "--no-access-log"]
