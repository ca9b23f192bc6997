# The image of every mqstore service (commitlog by default; compose runs index with another command). Build: `docker compose build`; run: `docker compose up`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first (exact pins), so code changes do not reinstall them.
COPY requirements.lock ./
RUN pip install "setuptools>=68" wheel \
 && pip install -r requirements.lock

# The code, the stubs generated from protos/ (one command, as in `make gen`), then the package itself.
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY scripts ./scripts
COPY core ./core
COPY services ./services
RUN python scripts/gen_protos.py \
 && pip install --no-deps --no-build-isolation . \
 && python -c "import commitlog_service.main, mqstore_rpc.gen.mqstore.v1.commitlog_pb2_grpc"

# Run as an unprivileged user that owns only the data volume.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin mqstore \
 && mkdir -p /data \
 && chown mqstore:mqstore /data
USER mqstore
VOLUME ["/data"]
EXPOSE 50051 50052

# 0.0.0.0 only inside a container: the published port decides who can reach it.
CMD ["python", "-m", "commitlog_service.main", "--host", "0.0.0.0", "--data-dir", "/data"]
