"""The server's app over a backend a test chose, as `server.app` builds it for a process, with the settings of the
test process (its conftest's) except for what the test says."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import SecretStr

from opencode_env.sandbox.base import SandboxBackend
from opencode_env.server.app import create_app
from opencode_env.server.runtime import Runtime
from opencode_env.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI


def runtime_for(
    backend: SandboxBackend | None = None, *, max_rollouts: int | None = None, token: str | None = None
) -> Runtime:
    settings = Settings.load()
    if token is not None:
        settings = settings.model_copy(update={"token": SecretStr(token)})
    return Runtime.build(settings, backend=backend, max_rollouts=max_rollouts)


def app_for(
    backend: SandboxBackend | None = None, *, max_rollouts: int | None = None, token: str | None = None
) -> FastAPI:
    """The app; with a token (default: the settings'), every route but /health requires it; with none, only callers
    on this machine."""
    return create_app(runtime_for(backend, max_rollouts=max_rollouts, token=token))
