"""The audit's shell parts run by a real bash: every play parses, the survey and a play's exit status, the native
layout's verify environment."""

from __future__ import annotations

import subprocess
from pathlib import Path

from opencode_env.audit.layouts import (
    CONTAINER_PATH,
    HARDENING,
    found_nothing,
    parse_survey,
    play_command,
    play_exit,
    survey_commands,
    unhardened,
)
from opencode_env.audit.plays import NOT_APPLICABLE, builtin_plays, parse_play
from opencode_env.wire import MAX_COMMAND_CHARS

FAMILIES = {
    "visible tests",
    "test-runner hooks",
    "interpreter start-up",
    "code under test",
    "reward channel",
    "repository history",
    "exposed answers",
    "grader programs",
}


def test_the_builtin_panel_covers_every_family_and_fits_a_command() -> None:
    plays = builtin_plays()
    assert {play.family for play in plays} == FAMILIES
    assert len({play.name for play in plays}) == len(plays) >= 17
    for play in plays:
        assert len(play_command(play)) <= MAX_COMMAND_CHARS
        checked = subprocess.run(["bash", "-n"], input=play_command(play), text=True, capture_output=True, check=False)
        assert checked.returncode == 0, (play.name, checked.stderr)


def test_the_survey_runs_each_test_and_lists_what_applies(tmp_path: Path) -> None:
    yes = parse_play("# name: yes\n# family: f\n# tries: t\n# proves: p\n# applies: test -d .\n# fix: f\n", "y")
    no = parse_play("# name: no\n# family: f\n# tries: t\n# proves: p\n# applies: exit 1\n# fix: f\n", "n")
    keeping = parse_play(
        "# name: keeping\n# family: f\n# tries: t\n# proves: p\n# applies: true\n"
        "# keeps: echo conftest.py; echo ../escape; echo /abs; echo ./tests/conftest.py\n# fix: f\n",
        "k",
    )
    ran = subprocess.run(
        ["bash", "-c", "\n".join(survey_commands([yes, no, keeping]))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0
    survey = parse_survey(ran.stdout)
    assert survey.applies == {"yes", "keeping"}
    assert survey.keeps == {"keeping": ("conftest.py", "tests/conftest.py")}


def test_a_play_that_exits_not_applicable_is_told_apart(tmp_path: Path) -> None:
    play = parse_play(
        f"# name: p\n# family: f\n# tries: t\n# proves: p\n# applies: true\n# fix: f\nexit {NOT_APPLICABLE}\n", "p"
    )
    ran = subprocess.run(["bash", "-c", play_command(play)], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert ran.returncode == 0
    assert found_nothing(ran.stdout)
    assert play_exit(ran.stdout) == NOT_APPLICABLE
    assert play_exit("no line") is None


def test_unhardened_unsets_what_our_grader_sets() -> None:
    env = {name: "set" for name in HARDENING} | {"PATH": "/usr/bin:/bin", "KEEP": "kept"}
    ran = subprocess.run(["bash", "-c", unhardened("env")], env=env, capture_output=True, text=True, check=False)
    names = {line.split("=", 1)[0] for line in ran.stdout.splitlines()}
    assert "KEEP" in names
    assert not names & set(HARDENING)
    assert f"PATH={CONTAINER_PATH}" in ran.stdout.splitlines(), "a container's PATH, not our narrowed one"


def test_a_large_panel_is_surveyed_in_commands_that_each_fit_a_request(tmp_path: Path) -> None:
    padding = "x" * 2_000
    plays = [
        parse_play(f"# name: p{index}\n# family: f\n# tries: {padding}\n# proves: p\n# applies: true # {padding}\n"
                   f"# keeps: echo kept{index}.py\n# fix: f\n", f"p{index}")
        for index in range(20)
    ]  # fmt: skip
    commands = survey_commands(plays)
    assert len(commands) > 1
    assert all(len(command) <= MAX_COMMAND_CHARS for command in commands)
    outputs = [
        subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
        for command in commands
    ]
    survey = parse_survey("\n".join(outputs))
    assert survey.applies == {f"p{index}" for index in range(20)}
    assert survey.keeps["p7"] == ("kept7.py",)
