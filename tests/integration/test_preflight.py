"""A machine where the local backend cannot isolate: every rollout fails at once with the reason and the fix, never
as a setup failure, an agent error or a reward from commands that never ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_env.sandbox.base import Preflight
from opencode_env.sandbox.local.backend import INSTALL_HINT, LocalBackend
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.scripted.demo import demo_request
from opencode_env.server.rollouts import Rollouts


async def test_a_failed_preflight_answers_every_rollout_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    backend = LocalBackend(cached_tools, base_dir=tmp_path)
    assert backend.preflight_verdict() == Preflight(INSTALL_HINT)
    preflight = await backend.preflight()
    problem = preflight.problem
    assert problem is not None
    assert preflight.proven
    assert backend.preflight_verdict() == preflight
    assert "bubblewrap" in problem
    assert "E2B_API_KEY" in problem
    result = await Rollouts(backend, 2).run(
        demo_request("http://127.0.0.1:9/v1", setup=["echo never"], verify=["true"])
    )
    assert (result.status, result.failed_phase) == ("sandbox_error", "sandbox")
    assert result.error == problem
    assert (result.reward, result.setup_results, result.verify_results) == (None, [], [])


async def test_a_working_machine_passes_its_preflight(backend: LocalBackend) -> None:
    assert await backend.preflight() == backend.preflight_verdict() == Preflight(None, proven=True)
