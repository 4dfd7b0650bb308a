# One image for every vcuda component: the webhook (vcuda-webhook), the
# certificate tool (vcuda-certs), the scheduler extender
# (vcuda-scheduler-extender), the node agent and installer (vcuda-node), and
# libvcuda.so, which the installer copies onto each GPU node.
#
#   docker build -t "REGISTRY/vcuda:$(scripts/image-tag)" .   # or podman / buildah
#
# Debian 12's python3 in a virtual environment (/opt/vcuda), on
# debian:bookworm-slim. BASE may name another Debian 12 root: tests/image
# builds this file with podman on one that mmdebstrap assembles from Debian's
# packages, so CI needs no registry, and checks the image it gives.

ARG BASE=docker.io/library/debian:bookworm-slim

FROM ${BASE} AS python
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/vcuda

FROM python AS shim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements/build.txt requirements/
COPY cshim/ cshim/
# zig cc (the ziglang wheel) builds it against glibc 2.17, so it loads in old
# images, and needs no C compiler of Debian's. cuda.h (a header only: the
# library links no CUDA) comes from NVIDIA's wheel. Both are pinned and hashed.
RUN /opt/vcuda/bin/pip install --no-cache-dir --require-hashes --no-deps \
        -r requirements/build.txt \
 && make -C cshim PYTHON=/opt/vcuda/bin/python \
 && install -D -m 0644 cshim/build/libvcuda.so /out/libvcuda.so

# The shim stage already holds the locked setuptools and wheel.
FROM shim AS wheel
COPY pyproject.toml setup.cfg README.md ./
COPY webhook/ webhook/
COPY runtime_hook/ runtime_hook/
COPY extender/ extender/
RUN /opt/vcuda/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM python
# The libraries exactly as requirements/runtime.txt pins and hashes them (the
# versions the tests ran), then vcuda's own wheel without resolving anything.
COPY requirements/runtime.txt /tmp/runtime.txt
COPY --from=wheel /wheels/ /tmp/wheels/
RUN /opt/vcuda/bin/pip install --no-cache-dir --require-hashes --no-deps -r /tmp/runtime.txt \
 && /opt/vcuda/bin/pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels /tmp/runtime.txt
# Where the node installer finds the library (the same path it uses on the host).
COPY --from=shim /out/libvcuda.so /usr/local/vcuda/lib/libvcuda.so
# The runtime configuration that vcuda-node install renders onto each node.
COPY manifests/node/ /usr/local/share/vcuda/node/
ENV PATH=/opt/vcuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT []
CMD ["vcuda-webhook", "--help"]
