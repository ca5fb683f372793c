"""What every `opencode-env` command shares: progress on stderr, a result's summary, and what each backend needs
(the settings, loaded once, are `opencode_env.settings.settings_or_exit`: the server's start shares them too)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from opencode_env.sandbox import BACKENDS
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.wire import Phase, RolloutResult, result_summary
from opencode_env.wire.notices import notice_lines


def progress_to_stderr(phase: Phase, message: str) -> None:
    print(f"[{phase}] {message}", file=sys.stderr, flush=True)


def image_progress_to_stderr(message: str) -> None:
    """A task image build's line (a STEP of the Dockerfile, an archive loaded), in the style of a rollout's phases."""
    print(f"[image] {message}", file=sys.stderr, flush=True)


def announce_image_work(backend: SandboxBackend) -> SandboxBackend:
    """`backend`, its image work (an archive loaded, an image unpacked into the local backend's cache: minutes for a
    large image, once) printed as progress lines; other backends do none here."""
    from opencode_env.sandbox.local.services import LocalBackend

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
    lines += notice_lines(result.warning_notices())
    return "\n".join(lines)


def needs(names: Sequence[str]) -> str:
    return "; ".join(f"{name} needs {BACKENDS[name].needs}" for name in names)
