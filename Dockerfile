# One image for every vcuda component: the webhook (vcuda-webhook), the
# certificate tool (vcuda-certs), the node agent and installer (vcuda-node),
# and libvcuda.so, which the installer copies onto each GPU node.
#
#   docker build -t REGISTRY/vcuda:0.1.0 .
#
# CI has no container engine, so this file is not built there; it is kept
# deliberately plain: a build stage for the C shim, one for the Python wheel,
# and a slim runtime stage that runs as an unprivileged user.

FROM python:3.11-slim-bookworm AS shim
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY cshim/ cshim/
# zig cc (the ziglang wheel) builds it against glibc 2.17: it loads in old images.
# cuda.h (a header only: the library links no CUDA) comes from NVIDIA's wheel.
RUN pip install --no-cache-dir 'ziglang>=0.13' 'nvidia-cuda-runtime-cu12>=12.5' \
 && make -C cshim PYTHON=python3 \
 && install -D -m 0644 "$(find cshim -name libvcuda.so -print -quit)" /out/libvcuda.so

FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY webhook/ webhook/
COPY runtime_hook/ runtime_hook/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
COPY --from=wheel /wheels/ /tmp/wheels/
RUN pip install --no-cache-dir /tmp/wheels/*.whl && rm -rf /tmp/wheels
# Where the node installer finds the library (the same path it uses on the host).
COPY --from=shim /out/libvcuda.so /usr/local/vcuda/lib/libvcuda.so
# The runtime configuration that vcuda-node install renders onto each node.
COPY manifests/node/ /usr/local/share/vcuda/node/
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT []
CMD ["vcuda-webhook", "--help"]
