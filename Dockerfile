# One image, three roles: the gateway (default), the sandbox executor and the MCP bridge.
#   docker build -t antwort-grpc:0.1.0 .
#   docker run -e ANTWORT_AUTH=api_key -e ANTWORT_API_KEYS_FILE=… antwort-grpc:0.1.0   # serve
#   (without authentication the gateway refuses its 0.0.0.0 address unless
#    ANTWORT_ALLOW_UNAUTHENTICATED=true)
#   docker run -e ANTWORT_EXECUTOR_TOKEN_FILE=… antwort-grpc:0.1.0 executor sandbox   # code_interpreter
#   docker run -e ANTWORT_EXECUTOR_TOKEN_FILE=… antwort-grpc:0.1.0 executor mcp       # MCP bridge
#   (an executor, too, refuses its 0.0.0.0 address without a token or mutual TLS unless
#    ANTWORT_EXECUTOR_ALLOW_UNAUTHENTICATED=true)
# The local-model extra (llama.cpp and model weights) is left out: in a cluster the gateway talks
# to a model server (vLLM, Ollama, LiteLLM) over ANTWORT_BACKEND_URL.

# Bookworm: util-linux is an essential package there, so the sandbox finds `unshare` (namespaces,
# where the node allows them) and `setpriv` (dropping to another uid when run as root) without apt.
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/antwort
WORKDIR /src
# Dependencies first (pinned in pyproject.toml), so code changes reuse this layer.
COPY pyproject.toml README.md ./
RUN mkdir antwort_grpc && touch antwort_grpc/__init__.py \
    && /opt/antwort/bin/pip install --no-cache-dir . \
    && /opt/antwort/bin/pip uninstall --yes antwort-grpc
COPY antwort_grpc ./antwort_grpc
RUN /opt/antwort/bin/pip install --no-cache-dir --no-deps . \
    && /opt/antwort/bin/python -m compileall -q /opt/antwort/lib

FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 antwort \
    && useradd --system --uid 10001 --gid antwort --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin antwort \
    && mkdir -p /var/lib/antwort \
    && chown antwort:antwort /var/lib/antwort
COPY --from=build /opt/antwort /opt/antwort
ENV PATH=/opt/antwort/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ANTWORT_LISTEN=0.0.0.0:50051 \
    ANTWORT_HTTP_LISTEN=0.0.0.0:8080 \
    ANTWORT_EXECUTOR_LISTEN=0.0.0.0:50061 \
    ANTWORT_DATA_DIR=/var/lib/antwort
WORKDIR /var/lib/antwort
# A numeric user, so Kubernetes can verify runAsNonRoot without looking up names.
USER 10001:10001
EXPOSE 50051 8080 50061
ENTRYPOINT ["antwort-grpc"]
CMD ["serve"]
