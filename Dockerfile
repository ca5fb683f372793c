# The Hugging Face Space image: serves the MCP tool on port 8000 as a non-root user.
FROM python:3.11-slim

ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap nodejs npm ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir uv \
    && useradd --create-home --uid 1000 user

USER user
ENV HOME=/home/user \
    PATH=/home/user/app/.venv/bin:$PATH \
    OPENCODE_ENV_CACHE=/home/user/.cache/opencode-env \
    HOST=0.0.0.0 PORT=8000
WORKDIR /home/user/app

COPY --chown=user pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project
COPY --chown=user opencode_env opencode_env
COPY --chown=user server server
COPY --chown=user openenv.yaml ./
# The pinned OpenCode is installed at build time, so no rollout waits for it.
RUN uv sync --frozen --no-dev && opencode-env install

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
CMD ["server"]
