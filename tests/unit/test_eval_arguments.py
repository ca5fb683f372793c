"""`opencode-env eval`'s arguments, refused before anything runs (no cluster, no server, no sandbox)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_env.cli import main


def test_eval_refuses_ray_with_a_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["eval", str(tmp_path), "--out", str(tmp_path / "o"), "--ray", "auto", "--server", "http://x"]
    assert main(argv) == 2
    assert "exclude each other" in capsys.readouterr().err
