# syntax=docker/dockerfile:1
#
# actfleet images. Targets:
#   worker (default)  actfleet installed from pyproject.toml; entrypoint `actfleet`
#                     (the worker node and the client commands: run, submit, watch, ...)
#   flower            the same image plus Celery Flower; entrypoint `celery`, run as
#                     `celery -A actfleet.broker.flower_app flower`
#
#   docker build -t actfleet:0.1.0 .
#   docker build -t actfleet-flower:0.1.0 --target flower .
#
# Provider keys are never baked in: workers get them from their environment at run time
# (compose env_file / a Kubernetes Secret). See deploy/README.md.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS app

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# tini as PID 1: SIGTERM goes to the node only (kernels are not signalled directly, so
# running steps can finish), and orphaned processes of kernels' `!cmd`s are reaped.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini bubblewrap util-linux \
    && rm -rf /var/lib/apt/lists/*

# Non-editable install of the project (dependencies come from pyproject.toml).
COPY pyproject.toml README.md /tmp/actfleet-src/
COPY actfleet /tmp/actfleet-src/actfleet
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install /tmp/actfleet-src \
    && rm -rf /tmp/actfleet-src

# Non-root user. Kernels run as this user; its home holds IPython's profile and
# `pip install --user` packages (the user site dir exists so `!pip install` works at once).
RUN groupadd --gid 10001 actfleet \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin actfleet \
    && mkdir -p /var/lib/actfleet \
    && chown actfleet:actfleet /var/lib/actfleet
USER 10001:10001
ENV HOME=/home/actfleet
RUN mkdir -p "$(python -m site --user-site)"
WORKDIR /home/actfleet

# Root of the agents' working directories (one subdirectory per node name).
ENV ACTFLEET_WORKDIR=/var/lib/actfleet

ENTRYPOINT ["/usr/bin/tini", "--", "actfleet"]
CMD ["worker"]


FROM app AS flower
USER 0
RUN --mount=type=cache,target=/root/.cache/pip pip install "flower>=2.0,<3"
USER 10001:10001
EXPOSE 5555
ENTRYPOINT ["/usr/bin/tini", "--", "celery"]
# actfleet's own Celery app (msgpack, its queues and transport), from ACTFLEET_* settings:
# without it nodes refuse Flower's JSON control messages and Flower sees no task.
CMD ["-A", "actfleet.broker.flower_app", "flower", "--port=5555"]


# The default target (last stage): the actfleet image.
FROM app AS worker
