"""What every `opencode-env` command shares: the operator's settings loaded once, progress on stderr, a result's
summary, and what each backend needs."""

from __future__ import annotations

import functools
import socket
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from opencode_env.sandbox import BACKENDS
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.settings import Settings, unknown_variable_warnings
from opencode_env.wire import Phase, RolloutResult, result_summary


@functools.cache
def warn_unknown_variables() -> None:
    """Once per process, at its start: each OPENCODE_ENV_* variable that is no setting, with the closest name."""
    for line in unknown_variable_warnings():
        print(f"opencode-env: warning: {line}", file=sys.stderr)


def settings_or_exit() -> Settings:
    """The operator's settings, loaded once by the command that needs them; a refused one ends it with its name.
    Unknown OPENCODE_ENV_* variables are warned about the first time (the server's start goes through here too)."""
    warn_unknown_variables()
    try:
        return Settings.load()
    except ValidationError as error:
        print(f"opencode-env: a setting is refused: {error}", file=sys.stderr)
        raise SystemExit(2) from error


def progress_to_stderr(phase: Phase, message: str) -> None:
    print(f"[{phase}] {message}", file=sys.stderr, flush=True)


def image_progress_to_stderr(message: str) -> None:
    """A task image build's line (a STEP of the Dockerfile, an archive loaded), in the style of a rollout's phases."""
    print(f"[image] {message}", file=sys.stderr, flush=True)


def announce_image_work(backend: SandboxBackend) -> SandboxBackend:
    """`backend`, its image work (an archive loaded, an image unpacked into the local backend's cache: minutes for a
    large image, once) printed as progress lines; other backends do none here."""
    from opencode_env.sandbox.local.backend import LocalBackend

    if isinstance(backend, LocalBackend):
        backend.image_progress = image_progress_to_stderr
    return backend


def summarize(result: RolloutResult) -> str:
    """The result's summary, then what a trainer must know: how much of the agent's tokens each export carries, and
    the result's warnings."""
    from opencode_env.training.sequences import training_summary

    lines = [result_summary(result)]
    coverage = training_summary(result).coverage if result.proxy_turns else None
    if coverage is not None:
        lines.append(f"coverage:   {coverage.text()}")
    lines += [f"warning:    {warning}" for warning in result.warnings]
    return "\n".join(lines)


def needs(names: Sequence[str]) -> str:
    return "; ".join(f"{name} needs {BACKENDS[name].needs}" for name in names)


def exit_unless_free(host: str, port: int) -> None:
    """Before anything starts (and logs that it is ready): a port another process holds ends the command with what
    to do. A probe, then uvicorn binds for itself; a process that takes the port in between still fails there."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as error:
        print(
            f"opencode-env serve: cannot listen on {host}:{port}: {error.strerror or error} (another server on this "
            "port? stop it, or pass --port N / set PORT)",
            file=sys.stderr,
        )
        raise SystemExit(2) from error
