"""`opencode-env audit`'s arguments, refused before anything runs (no image, no sandbox, no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_env.cli import main


def test_audit_refuses_two_places_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(tmp_path), "--ray", "auto", "--server", "http://x"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_audit_names_a_play_it_does_not_know(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(tmp_path), "--play", "no-such-play"]) == 2
    assert "--play: no play named no-such-play" in capsys.readouterr().err


def test_audit_names_a_broken_play_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plays = tmp_path / "plays"
    plays.mkdir()
    (plays / "mine.sh").write_text("#!/bin/bash\n# name: mine\n# family: f\necho hi\n")
    assert main(["audit", str(tmp_path), "--plays", str(plays)]) == 2
    assert "mine.sh: header lacks tries, proves, applies, fix" in capsys.readouterr().err


def test_audit_names_an_input_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(tmp_path / "nope.json"), "--out", str(tmp_path / "out")]) == 2
    assert "nope.json: no such file or directory" in capsys.readouterr().err
