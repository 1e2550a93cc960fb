# Chamber's image: every service (`chamber service <name>`), the node agent (`CHAMBER_COLLECTOR_ROLE=agent`, run
# with the NVIDIA container runtime, which mounts NVML) and the webhook certificate hook (`chamber webhook-cert`).
# Build: docker build -t ghcr.io/chamber-io/chamber:0.1.0 .
FROM python:3.11-slim AS build
# A C compiler for the wheel's mypyc-compiled scheduling core (setup.py); the image itself needs none.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY libs libs
COPY services services
RUN CHAMBER_COMPILE=require pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin chamber
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels chamber && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    CHAMBER_LOG_FORMAT=json
USER 65532:65532
ENTRYPOINT ["chamber"]
CMD ["--help"]
