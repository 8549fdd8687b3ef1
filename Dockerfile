# One image for every role: `mlless worker`, `mlless supervisor` (and, with issue #4, the operator).
# Stage 1 compiles the Cython kernels into a wheel; stage 2 is a slim runtime running as non-root.
FROM python:3.11 AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY functions ./functions
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 mlless
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
WORKDIR /home/mlless
ENTRYPOINT ["mlless"]
CMD ["--help"]
