# One image for bookies and the operator (target `octavo`, the default), and one for Spark jobs (target `spark`).
#
#   docker build -t octavo:dev .                      # bookies: `octavo node`; operator: `octavo operator run`
#   docker build -t octavo-spark:dev --target spark .  # the same plus PySpark, pyarrow and a Java runtime
#
# The build stage makes a virtual environment from the wheel of this checkout; the final stages copy only that
# environment onto a slim Python: no compiler, no pip cache, no sources. Everything runs as the non-root user
# octavo (uid 1000), and /data (a bookie's data directory) is a volume it owns.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto/octavo ./proto/octavo
COPY shared/octavo ./shared/octavo
COPY client/octavo ./client/octavo
COPY cli/octavo ./cli/octavo
COPY client/spark_discovery ./client/spark_discovery
COPY node/octavo ./node/octavo
COPY operator/octavo ./operator/octavo
COPY sim/octavo ./sim/octavo
RUN python -m venv /opt/octavo \
 && /opt/octavo/bin/pip install --upgrade pip \
 && /opt/octavo/bin/pip wheel --no-deps -w /tmp/wheels . \
 && /opt/octavo/bin/pip install "$(ls /tmp/wheels/octavo-*.whl)[operator]" \
 && /opt/octavo/bin/python -m compileall -q /opt/octavo

FROM build AS build-spark
RUN /opt/octavo/bin/pip install "$(ls /tmp/wheels/octavo-*.whl)[operator,spark]" \
 && /opt/octavo/bin/python -m compileall -q /opt/octavo

FROM ${PYTHON_IMAGE} AS octavo
LABEL org.opencontainers.image.title="octavo" \
      org.opencontainers.image.description="Octavo: replicated log storage for data pipelines (bookie and operator)" \
      org.opencontainers.image.source="https://github.com/octavo-io/octavo" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 1000 octavo \
 && useradd --uid 1000 --gid 1000 --home-dir /data --no-create-home --shell /usr/sbin/nologin octavo \
 && mkdir -p /data /etc/octavo \
 && chown 1000:1000 /data
COPY --from=build /opt/octavo /opt/octavo
ENV PATH=/opt/octavo/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 1000:1000
WORKDIR /data
VOLUME ["/data"]
# The bookie's port (gRPC data and admin planes) and the operator's liveness port.
EXPOSE 3181 8080
ENTRYPOINT ["octavo"]
# Arguments replace this: the operator's StatefulSets pass `node --config /etc/octavo/bookie.toml`, the chart's
# Deployment `operator run ...`; by hand: `docker run octavo:dev node --data-dir /data --host 0.0.0.0 --etcd E`.
CMD ["node", "--data-dir", "/data", "--host", "0.0.0.0"]

FROM octavo AS spark
USER 0:0
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-spark /opt/octavo /opt/octavo
# Spark finds Python data sources among top-level modules: the wheel installs pyspark_octavo as one.
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64
USER 1000:1000
WORKDIR /data
ENTRYPOINT ["python"]
CMD ["-c", "import pyspark_octavo; print('octavo spark image: run your job with python JOB.py')"]
