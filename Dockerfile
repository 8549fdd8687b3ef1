# Three targets, one per set of roles; the entrypoint of each is `mlless`:
#   worker    --target worker     the core install: worker pods (`mlless worker`) and Knative/OpenFaaS worker functions
#                                 (`mlless worker-server --port 8080`, the default command: an OpenFaaS Function has no
#                                 command field, so the image's own command must serve). No kopf, kubernetes or matplotlib.
#   operator  --target operator   adds the `supervisor` and `operator` extras (kubernetes, kopf): the operator (the chart
#                                 runs `kopf run --standalone ... -m mlless_operator.main`) and the supervisor pods
#                                 (`mlless supervisor`). It runs workers too, since the operator hands its own image to
#                                 a job's supervisor and workers alike.
#   full      (the default)       adds the `report` extra (matplotlib): every command, the contents of the single image
#                                 before the split.
# The `wheel` stage compiles the Cython kernels once; each venv stage installs that wheel with its extras into a
# virtualenv, and each target copies only its virtualenv onto the slim base and runs as uid 10001. See images/README.md.

# Optional extras every target adds to its own (comma-separated). `s3` (s3fs) lets pods read s3:// datasets;
# build with --build-arg EXTRAS= for images without it, and with EXTRAS=s3,torch for the images that run
# spec.model.type neural-net (the operator's extraImages).
ARG EXTRAS=s3
# Where the `torch` extra's torch and torchvision come from when EXTRAS holds it: empty, PyPI, whose Linux wheels are
# built for CUDA and bring the nvidia-* libraries (a 5.5 GB virtualenv); https://download.pytorch.org/whl/cpu, the
# CPU-only wheels (about 1 GB). See images/README.md.
ARG TORCH_INDEX=

FROM python:3.11 AS wheel
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY functions ./functions
COPY operator ./operator
# The build isolation fetches Cython and numpy (pyproject [build-system]) and compiles the kernels.
RUN python3 -m pip wheel --no-deps --wheel-dir /wheels .
COPY images/install-venv.sh images/import-extensions.py images/extra-requirements.py /images/

FROM wheel AS venv-worker
ARG EXTRAS
ARG TORCH_INDEX
RUN /images/install-venv.sh "$EXTRAS" "$TORCH_INDEX"

FROM wheel AS venv-operator
ARG EXTRAS
ARG TORCH_INDEX
RUN /images/install-venv.sh "supervisor,operator,$EXTRAS" "$TORCH_INDEX"

FROM wheel AS venv-full
ARG EXTRAS
ARG TORCH_INDEX
RUN /images/install-venv.sh "supervisor,operator,report,$EXTRAS" "$TORCH_INDEX"

FROM python:3.11-slim AS runtime
LABEL org.opencontainers.image.title="mlless" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 mlless && useradd --uid 10001 --gid 10001 --create-home mlless
# HOME and MPLCONFIGDIR point at /tmp, so a read-only root filesystem with a writable /tmp works
# (the operator's pods set the same); the .pyc files were compiled at install time.
ENV PATH=/opt/mlless/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["mlless"]
CMD ["worker-server", "--port", "8080"]

FROM runtime AS worker
LABEL org.opencontainers.image.description="Serverless ML training on Kubernetes: the worker functions"
COPY --from=venv-worker /opt/mlless /opt/mlless

FROM runtime AS operator
LABEL org.opencontainers.image.description="Serverless ML training on Kubernetes: operator, supervisor and worker functions"
COPY --from=venv-operator /opt/mlless /opt/mlless

FROM runtime AS full
LABEL org.opencontainers.image.description="Serverless ML training on Kubernetes: operator, supervisor, worker functions and reports"
COPY --from=venv-full /opt/mlless /opt/mlless
