"""The image's USER as a request field and as the drop the sandbox's root runs: any USER text is either refused by
name or reaches setpriv as exactly the words it is, never as shell."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opencode_env.rollout.image_user import as_image_user, owner
from opencode_env.wire import RolloutRequest

STUBS = {
    "setpriv": '#!/bin/sh\nprintf "%s\\n" "$@"\n',
    "id": "#!/bin/sh\nexit 1\n",
    "getent": "#!/bin/sh\nexit 2\n",
}


@pytest.fixture(scope="module")
def stub_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    stubs = tmp_path_factory.mktemp("stubs")
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    return f"{stubs}:/usr/bin:/bin"


def test_solution_as_image_user_needs_the_user() -> None:
    with pytest.raises(ValidationError, match="image_user"):
        RolloutRequest(instruction="x", solution=["true"], solution_as="image_user")
    with pytest.raises(ValidationError, match="image_user"):
        RolloutRequest(instruction="x", image_user="app;touch /pwned")


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_any_user_is_refused_or_passed_verbatim(stub_path: str, user: str) -> None:
    try:
        RolloutRequest(instruction="x", image_user=user)
    except ValidationError:
        return
    name, _, group = user.partition(":")
    ran = subprocess.run(
        ["bash", "-c", as_image_user(user, "echo hi")],
        capture_output=True,
        text=True,
        env={"PATH": stub_path},
        timeout=30,
        check=False,
    )
    words = ran.stdout.splitlines()
    assert words[:2] == [f"--reuid={name}", f"--regid={group or 0}"], (user, ran.stdout, ran.stderr)
    assert words[-4:] == ["--", "/bin/sh", "-c", "echo hi"]
    chown = subprocess.run(
        ["bash", "-c", f"printf '%s' {owner(user)}"],
        capture_output=True,
        text=True,
        env={"PATH": stub_path},
        check=False,
    )
    assert chown.stdout == f"{name}:{group or 0}"


def test_an_image_without_setpriv_is_told_so(tmp_path: Path) -> None:
    ran = subprocess.run(
        ["/bin/bash", "-c", as_image_user("app", "true")],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path)},
        timeout=30,
        check=False,
    )
    assert ran.returncode == 126
    assert "the image's USER app: the image has no setpriv" in ran.stderr
    assert os.listdir(tmp_path) == []
