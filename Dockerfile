# The sampling service as a container: `cvae serve` with one worker per core, serving a folder
# of `cvae export` baked into the image at /model (docs/service-deployment.md walks through
# building, running, scaling and rolling it). Mount another export over /model to serve it
# without a rebuild; the service only reads there, so read-only is enough. The build context is
# only what is copied below (.dockerignore), so the export must be a folder named exported*.
#
#   cvae export --out exported
#   docker build -t cvae-serve:1 .                        # EXPORT=another-folder to bake that one
#   docker run --rm -p 8000:8000 cvae-serve:1
#   docker run --rm -p 8000:8000 -v "$PWD/exported-2:/model:ro" cvae-serve:1
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# The user has no home: compiled programs are kept in /tmp, seeded from the export's own
# (compiled-programs.zip; docs/service-startup.md). Mount a volume there to keep them across
# restarts of the container.
ENV CVAE_COMPILATION_CACHE=/tmp/cvae-xla
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY cvae ./cvae
COPY service ./service
# A fixed uid, so a Kubernetes pod can name it (runAsUser, fsGroup: deploy/kubernetes.yaml).
RUN pip install . && useradd --system --uid 10001 --no-create-home cvae
ARG EXPORT=exported
COPY --chown=10001 ${EXPORT} /model
USER 10001

EXPOSE 8000
# /healthz: the process answers; /readyz: the model is loaded and compiled. A worker answers
# neither before its model is loaded: up to 4.5 minutes measured on a busy machine, so the
# start period is 10 minutes, as the Kubernetes startup probe's (docs/service-deployment.md).
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s \
    CMD python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"
# SIGTERM (docker stop, Kubernetes) drains in-flight requests and exits 0.
STOPSIGNAL SIGTERM
CMD ["cvae", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "auto", \
     "--checkpoint-dir", "/model", "--no-access-log"]
