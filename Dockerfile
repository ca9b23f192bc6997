# The images of mqstore. Targets (pass one: see the note on the order of the stages below):
#   runtime  every mqstore service (commitlog by default; compose runs index with another command):
#            the package and its runtime dependencies (requirements.lock) only.
#            docker build --target runtime -t mqstore:dev .      (docker compose build does this)
#   spark    the runtime plus pyspark, pyarrow and pandas (requirements-spark.lock) and Debian's Java 17
#            runtime: compose's compactor (the Spark driver of heavy rounds), spark-master and
#            spark-worker (pyspark's spark-class; the executors run /opt/mqstore/bin/python).
#            docker build --target spark -t mqstore-spark:dev .      (docker compose build compactor)
# Build arguments:
#   PYTHON_IMAGE    base image; a pinned tag by default (Python 3.11 on Debian bookworm, whose Java 17
#                   the spark target installs). Pin a digest for production: python:3.11.13-slim-bookworm@sha256:…
#   PIP_INDEX_URL   a private package index (https://pypi.example.com/simple); default: pip's own.
#   EXTRA_CA_CERTS  PEM text of CA certificates to trust while downloading (pip, apt), for a TLS-
#                   inspecting proxy or the private index: --build-arg EXTRA_CA_CERTS="$(cat ca.pem)".
#                   Used by the download steps only (scripts/docker-build-env.sh), not kept in the images.
# Stage order: the classic builder (Docker Engine without BuildKit) builds every stage before the
# target, so the runtime target comes before the spark stages and a runtime build never builds Spark.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# An unprivileged user that owns only the data volume (and /auth: the auth database the services share
# when authentication is on, and /kek: the key-encryption key of SDK secrets; docker-compose.secure.yml),
# 0700 as the services make their directories (umask 077: mqstore_rpc.private_files); a new named volume
# takes the mode of the image's directory.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin mqstore \
 && mkdir -p /data /auth /kek \
 && chown mqstore:mqstore /data /auth /kek \
 && chmod 0700 /data /auth /kek

# ---- build: a C toolchain for the compiled codec, pinned tools, the runtime dependencies in
# /opt/mqstore (a venv without pip), stubs from protos/, then the package as a wheel (with the codec's
# extension modules, compiled here) into the same venv. Only /opt/mqstore leaves this stage: the
# compiler and headers stay behind, the runtime stage gets the built .so files and zlib (already in the
# base image) only.
FROM base AS build
ARG PIP_INDEX_URL=""
ARG EXTRA_CA_CERTS=""
WORKDIR /src
COPY scripts/docker-build-env.sh requirements.lock requirements-build.lock ./
# gcc and zlib.h for the codec (setup.py); the Python headers only where the base image lacks them (the
# official image has its own in /usr/local/include; a Debian-Python base needs python3.11-dev).
# Debian bookworm packages, as the spark stage's JRE: not pinned to versions the mirror drops.
RUN . ./docker-build-env.sh \
 && headers=$(python -c "import os, sysconfig; print('' if os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')) else 'python3.11-dev')") \
 && apt-get $APT_CA_OPTION update \
 && DEBIAN_FRONTEND=noninteractive apt-get $APT_CA_OPTION install -y --no-install-recommends gcc libc6-dev zlib1g-dev $headers \
 && rm -rf /var/lib/apt/lists/* \
 && python -m pip install -r requirements-build.lock -r requirements.lock \
 && python -m venv --without-pip /opt/mqstore \
 && python -m pip --python /opt/mqstore/bin/python install -r requirements.lock
COPY pyproject.toml setup.py README.md ./
COPY protos ./protos
COPY scripts ./scripts
COPY core ./core
COPY services ./services
COPY spark ./spark
# MQSTORE_REQUIRE_COMPILED: a codec that does not compile fails the build (setup.py) instead of an
# image that runs on the pure-Python codec; the runtime stage checks the codec imports.
RUN python scripts/gen_protos.py \
 && MQSTORE_REQUIRE_COMPILED=1 python -m pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/dist . \
 && python -m pip --python /opt/mqstore/bin/python install --no-deps /tmp/dist/*.whl \
 && python -m pip --python /opt/mqstore/bin/python check

# ---- runtime
FROM base AS runtime
COPY --from=build /opt/mqstore /opt/mqstore
ENV PATH=/opt/mqstore/bin:$PATH
RUN python -c "import mqstore_launcher.node, commitlog_service.main, index_service.main, gateway_service.main, mqstore_rpc.healthcheck, mqstore_rpc.gen.mqstore.v1.commitlog_pb2_grpc" \
 && python -c "import sys; from mqstore import codec; sys.exit(None if codec.ACTIVE == codec.COMPILED else codec.REASON)"
USER mqstore
VOLUME ["/data"]
EXPOSE 50051 50052
# 0.0.0.0 only inside a container: the published port decides who can reach it. The port comes from
# MQSTORE_PORT (default 50051), which the health check (python -m mqstore_rpc.healthcheck) reads too.
CMD ["python", "-m", "mqstore_launcher.node", "--host", "0.0.0.0", "--data-dir", "/data"]

# ---- spark: pyspark into a copy of the runtime venv, then a Java runtime from Debian
FROM build AS spark-build
ARG PIP_INDEX_URL=""
ARG EXTRA_CA_CERTS=""
COPY requirements-spark.lock ./
RUN . ./docker-build-env.sh \
 && python -m pip --python /opt/mqstore/bin/python install -r requirements-spark.lock \
 && python -m pip --python /opt/mqstore/bin/python check

FROM base AS spark
ARG EXTRA_CA_CERTS=""
COPY scripts/docker-build-env.sh /tmp/
# Debian's JRE (bookworm security updates: not pinned to a package version, which the mirror drops).
# Its post-install step needs the man directory that slim images leave out.
RUN . /tmp/docker-build-env.sh \
 && mkdir -p /usr/share/man/man1 \
 && apt-get $APT_CA_OPTION update \
 && DEBIAN_FRONTEND=noninteractive apt-get $APT_CA_OPTION install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* /tmp/*
COPY --from=spark-build /opt/mqstore /opt/mqstore
ENV PATH=/opt/mqstore/bin:$PATH
RUN python -c "import pyspark, pyarrow, pandas, compactor_service.main, mqstore_spark.round_job" && java -version \
 && mkdir -p /tier && chown mqstore:mqstore /tier && chmod 0700 /tier
# /tier: compose's file:// tier of the Spark rounds (volume spark-tier; the compactor and the workers, as mqstore)
USER mqstore
VOLUME ["/data"]
CMD ["python", "-m", "mqstore_launcher.node", "--host", "0.0.0.0", "--data-dir", "/data"]
