# The image the manifests in deploy/ name: docker build -t llm-gateway:0.1.0 .
# Two stages: wheels are built (and dependencies fetched) in the first, so the image holds
# neither the source tree nor pip's caches.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY routing ./routing
COPY cache_index ./cache_index
COPY vllm_api ./vllm_api
COPY simulator ./simulator
COPY telemetry ./telemetry
COPY benchmarks ./benchmarks
RUN pip wheel --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels llm-gateway \
    && groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gateway
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["llm-gateway"]
CMD ["serve", "--config", "/etc/llm-gateway/gateway.toml"]
