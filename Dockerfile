# The Hugging Face Space image (the server on port 8000), and the image of Hugging Face sandboxes
# (hf.co/spaces/<owner>/<space>): OpenCode's single binary and the capture proxy's packages, root-owned.
# Node and npm are not needed: OpenCode is a self-contained binary, fetched from the npm registry at build time by
# the same script the hf backend runs in a sandbox whose image lacks it (opencode_env/sandbox/hf_shell.py).
ARG BASE=python:3.11-slim-trixie

FROM ${BASE} AS build
ARG UV_VERSION=0.13.9
ENV UV_LINK_MODE=copy UV_NO_CACHE=1 UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=/opt/app/.venv
# A build behind a TLS-intercepting proxy passes its CA bundle as the build secret `ca` (./dev image does); it is
# used by the downloads below and never stored in a layer.
ENV TRUST='if [ -f /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca PIP_CERT=/run/secrets/ca; fi'
RUN --mount=type=secret,id=ca eval "$TRUST" \
    && python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir --quiet "uv==${UV_VERSION}"
WORKDIR /opt/app
# The dependencies' layer reads only pyproject.toml and uv.lock: an edit of the README or the code rebuilds what
# follows it, not the dependencies (minutes of downloads).
COPY pyproject.toml uv.lock ./
COPY package/pyproject.toml package/
RUN --mount=type=secret,id=ca eval "$TRUST" && /opt/uv/bin/uv sync --frozen --no-dev --no-install-workspace
COPY README.md ./
COPY opencode_env opencode_env
COPY server server
COPY package package
COPY openenv.yaml ./
# Bytecode only for the modules the server and the proxy import (compiling every package would add ~150 MB).
RUN --mount=type=secret,id=ca eval "$TRUST" \
    && /opt/uv/bin/uv sync --frozen --no-dev --no-editable \
    && /opt/app/.venv/bin/python -m opencode_env.sandbox.cloud.hf_shell install-opencode /opt/opencode-env | sh -e \
    && version=$(/opt/app/.venv/bin/python -c "from opencode_env.rollout.opencode import OPENCODE_VERSION; print(OPENCODE_VERSION)") \
    && cache=/opt/opencode-env/cache/opencode-$version \
    && mkdir -p $cache/node_modules/.bin \
    && ln -s /opt/opencode-env/opencode-$version/package/bin/opencode $cache/node_modules/.bin/opencode \
    && echo $version > $cache/.complete \
    && (cd / && /opt/app/.venv/bin/python -c "import opencode_env.server.app, opencode_env.proxy.app") \
    && chmod -R go-w,a+rX /opt/app /opt/opencode-env

FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap git ripgrep ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc/* /usr/share/man/* \
    && (id -u user >/dev/null 2>&1 || useradd --create-home --uid 1000 --shell /bin/bash user)
COPY --from=build /opt/app /opt/app
COPY --from=build /opt/opencode-env /opt/opencode-env
# No USER: a Space runs the container as uid 1000 (`user`) anyway, and as the image of Hugging Face sandboxes its
# sandbox server must start as root (opencode-env then runs task commands as `user` and its proxy as root).
ENV PATH=/opt/app/.venv/bin:/opt/opencode-env/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    OPENCODE_ENV_CACHE=/opt/opencode-env/cache \
    HOME=/home/user HOST=0.0.0.0 PORT=8000
WORKDIR /home/user

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
CMD ["python", "-m", "opencode_env.server.app"]
