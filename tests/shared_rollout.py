"""For a module-scoped fixture whose one rollout several tests read: the leak check `no_leaks` makes after a test,
made once right after the shared rollout (its sandbox is closed by the time `run_rollout` returns)."""

from __future__ import annotations

from pathlib import Path

from opencode_env.testing.fake_e2b import FakeCloud
from opencode_env.testing.fake_hf import FakeHfCloud
from tests.conftest import processes_mentioning


def assert_nothing_left(sandbox_base: Path, fake_cloud: FakeCloud, hf_cloud: FakeHfCloud) -> None:
    """No sandbox directory, no process of any sandbox and no (fake) E2B or HF sandbox is left."""
    assert fake_cloud.alive == {}
    assert hf_cloud.alive == {}
    assert list(sandbox_base.iterdir()) == []
    assert processes_mentioning(str(sandbox_base)) == []
