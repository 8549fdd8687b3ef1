# One image for every role; the entrypoint is `mlless`:
#   operator                  mlless operator (the chart runs `kopf run --standalone ... -m mlless_operator.main`)
#   supervisor pod            mlless supervisor
#   worker pod (pod backend)  mlless worker
#   Knative / OpenFaaS worker mlless worker-server --port 8080 (the default command: an OpenFaaS
#                             Function has no command field, so the image's own command must serve)
# Stage 1 compiles the Cython kernels and installs the package into a virtualenv; stage 2 copies
# only that virtualenv onto the slim base and runs as uid 10001. See images/README.md.

FROM python:3.11 AS build
# Optional extras of the package to install (comma-separated). `s3` (s3fs) lets pods read s3:// datasets;
# build with --build-arg EXTRAS= for an image without it.
ARG EXTRAS=s3
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/mlless
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY functions ./functions
COPY operator ./operator
# The build isolation fetches Cython and numpy (pyproject [build-system]) and compiles the kernels.
# The constraint is a resolver hint: botocore (from s3fs) needs python-dateutil<3 while the newest
# kubernetes client needs >=3, and without the hint pip backtracks through aiobotocore for many minutes.
# The generated .c sources end up in the wheel as package data; the runtime does not need them.
RUN printf 'python-dateutil<3\n' > /tmp/constraints.txt \
 && /opt/mlless/bin/pip install --constraint /tmp/constraints.txt ".${EXTRAS:+[$EXTRAS]}" \
 && find /opt/mlless/lib -path '*/mlless/training/kernels/*.c' -delete \
 && find /opt/mlless/lib -path '*/mlless/training/kernels/*.so' -exec strip --strip-unneeded {} + \
 && /opt/mlless/bin/python -c "import mlless.training.kernels.pmf, mlless.training.kernels.logreg, mlless.training.kernels.optim, mlless.training.kernels.significance"

FROM python:3.11-slim
LABEL org.opencontainers.image.title="mlless" \
      org.opencontainers.image.description="Serverless ML training on Kubernetes: operator, supervisor and worker functions" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 mlless && useradd --uid 10001 --gid 10001 --create-home mlless
COPY --from=build /opt/mlless /opt/mlless
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
