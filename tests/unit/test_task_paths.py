"""A request's paths land inside the task's roots or are refused, however they are spelled: the wire's check, the
request's validation and the local backend's write map, each over generated paths against an oracle that resolves
a path as the kernel does (component by component, '..' going up)."""

from __future__ import annotations

import posixpath
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opencode_env.sandbox.base import SandboxError, SandboxSpec
from opencode_env.sandbox.local.isolation.bubblewrap import (
    AGENT_CONFIG_DIR,
    AGENT_HOME,
    CONTROL_MOUNT,
    GRADER_DIR,
    MANAGED_CONFIG_DIR,
    OUR_TOP_LEVEL,
    SOCKETS_DIR,
    TASK_ROOT,
    Layout,
)
from opencode_env.sandbox.local.isolation.host_runtime import HOST_MOUNT
from opencode_env.sandbox.local.sandbox_files import SandboxFiles
from opencode_env.wire import RolloutRequest
from opencode_env.wire.task_paths import (
    HOME,
    OPENCODE_IN_HOME,
    SANDBOX_TOP_LEVEL,
    TASK_TMP,
    WORKDIR,
    OutsideTaskRoots,
    confined_dir,
    confined_file,
)

OURS = (
    AGENT_HOME,
    AGENT_CONFIG_DIR,
    f"{AGENT_CONFIG_DIR}/plugin",
    CONTROL_MOUNT,
    MANAGED_CONFIG_DIR,
    GRADER_DIR,
    TASK_ROOT,
    HOST_MOUNT,
    str(SOCKETS_DIR),
    "/proc/self",
    "/etc",
    "/usr/lib",
    *OPENCODE_IN_HOME,
)
"""OpenCode's home and config, the control dir, the grader's, the task root's mount, the proxy's sockets, our
helpers' and the host's files, OpenCode's directories in the task's home."""
NAMES = [
    "..", ".", "", "home", "user", "opencode", "config", "plugin", "x.js", "run", "opencode-env", "opencode-task",
    "tmp", "app", "tests", "grader", "proc", "self", "workdir", "logs", "agent", ".opencode", ".config", ".rollout",
    "etc", "usr", "state", "share", ".local", ".cache",
    "\u00fc", "\u2024\u2024", "\uff0e\uff0e", "..\\", "\\..", "home\u200b", "HOME", " ", "...",
]  # fmt: skip
WORKDIRS = ["", WORKDIR, HOME, "/app", "/tmp/w", "/srv", "/opt/task"]


def components() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NAMES), st.text(min_size=1, max_size=6).filter(lambda s: "\x00" not in s))


def spelled_paths() -> st.SearchStrategy[str]:
    """Paths built of our private names, '..', '.', '//', unicode lookalikes, absolute or relative."""
    separators = st.sampled_from(["/", "//", "/./"])
    joined = st.lists(st.tuples(separators, components()), min_size=1, max_size=7).map(
        lambda parts: "".join(sep + name for sep, name in parts)
    )
    relative = joined.map(lambda path: path.lstrip("/"))
    under_ours = st.tuples(st.sampled_from(OURS), joined).map(lambda pair: pair[0] + pair[1])
    return st.one_of(joined, relative, under_ours, st.text(max_size=40))


def resolved(path: str, workdir: str) -> str | None:
    """Where the kernel would take `path` (no links), component by component; None above the root."""
    absolute = path if path.startswith("/") else f"{workdir or WORKDIR}/{path}"
    stack: list[str] = []
    for name in absolute.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            if not stack:
                return None
            stack.pop()
        else:
            stack.append(name)
    return "/" + "/".join(stack)


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def in_a_task_root(path: str) -> bool:
    top = path.split("/")[1]
    return (within(path, HOME) or within(path, TASK_TMP) or top not in SANDBOX_TOP_LEVEL) and not any(
        within(path, private) for private in OPENCODE_IN_HOME
    )


@settings(max_examples=800, deadline=None)
@given(spelled_paths(), st.sampled_from(WORKDIRS))
def test_a_path_lands_in_a_task_root_or_is_refused(path: str, workdir: str) -> None:
    try:
        landed = confined_file(path, workdir or WORKDIR)
    except OutsideTaskRoots:
        return
    assert "\x00" not in path
    assert ".." not in path.replace("\\", "/").split("/")
    assert landed == resolved(path, workdir)
    assert in_a_task_root(landed), landed
    assert not any(within(landed, ours) for ours in OURS), landed


@settings(max_examples=200, deadline=None)
@given(spelled_paths(), st.sampled_from(WORKDIRS))
def test_the_request_refuses_exactly_what_the_check_refuses(path: str, workdir: str) -> None:
    fields: dict[str, Any] = {"instruction": "x", "workdir": workdir}
    try:
        confined_file(path, workdir or WORKDIR)
        wire_ok = True
    except OutsideTaskRoots:
        wire_ok = False
    for field in ("files", "verify_files"):
        refused = problems({**fields, field: {path: "x"}})
        if wire_ok:
            assert all(len(where) > 1 for where in refused), refused  # only the key's own length or NUL bounds
        else:
            assert [where for where in refused if where[0] == field], refused


def problems(fields: dict[str, Any]) -> list[tuple[int | str, ...]]:
    try:
        RolloutRequest.model_validate(fields)
    except ValidationError as error:
        return [tuple(problem["loc"]) for problem in error.errors()]
    return []


@pytest.mark.parametrize("private", OURS)
@pytest.mark.parametrize("field", ["files", "verify_files"])
def test_every_private_path_is_refused_naming_the_field_the_path_and_the_roots(private: str, field: str) -> None:
    path = f"{private}/plugin/x.js"
    with pytest.raises(ValidationError) as refused:
        RolloutRequest(instruction="x", **{field: {path: "export default {}"}})
    message = str(refused.value)
    assert f"{field}: path '{path}'" in message
    assert f"{HOME} (OpenCode's" in message
    assert "/tmp or a top-level directory of the task's image" in message


@pytest.mark.parametrize(
    "workdir", [AGENT_HOME, AGENT_CONFIG_DIR + "/plugin", CONTROL_MOUNT, "/", "/etc", *OPENCODE_IN_HOME]
)
def test_a_work_dir_of_ours_is_refused(workdir: str) -> None:
    with pytest.raises(ValidationError, match="workdir: path"):
        RolloutRequest(instruction="x", workdir=workdir, files={"x.js": "export default {}"})


@pytest.mark.parametrize("workdir", [WORKDIR, HOME, "/app", "/tmp/w", "/tests", "/logs/x"])
def test_the_tasks_own_work_dirs_are_kept(workdir: str) -> None:
    assert confined_dir(workdir) == workdir
    assert RolloutRequest(instruction="x", workdir=workdir, files={"a/b.py": ""}).workdir == workdir


def test_harbors_and_the_usual_paths_are_kept() -> None:
    kept = {"/tests/test.sh": "", "/solution/solve.sh": "", "/home/user/data/x.csv": "", "/tmp/seed": "", "a.py": ""}
    assert RolloutRequest(instruction="x", files=kept, verify_files=kept).files == kept


def test_the_sandbox_keeps_no_top_level_name_the_wire_gives_a_task() -> None:
    assert OUR_TOP_LEVEL <= SANDBOX_TOP_LEVEL


def _files(tmp_path: Path, workdir: str, image: bool) -> SandboxFiles:
    compartment = SimpleNamespace(
        layout=Layout(tmp_path), ids=None, spec=SandboxSpec(workdir=workdir), image=object() if image else None
    )
    return SandboxFiles(cast(Any, compartment))


@settings(max_examples=500, deadline=None)
@given(spelled_paths(), st.sampled_from([w for w in WORKDIRS if w]), st.booleans())
def test_the_local_write_map_reaches_only_the_tasks_host_directories(path: str, workdir: str, image: bool) -> None:
    """The backend's own check, whatever the wire let through: a task's path maps to the task's home, its /tmp or
    the image's overlay root, never to OpenCode's home, the grader's, the control or the proxy's directory."""
    layout = Layout(Path("/rollout"))
    files = _files(layout.root, workdir, image)
    try:
        base, relative = files._task_relative(path)
    except SandboxError:
        return
    allowed = [layout.home, layout.tmp, *([layout.image_root] if image else [])]
    assert base in allowed
    assert ".." not in relative.split("/")
    assert not relative.startswith("/")
    landed = posixpath.normpath(posixpath.join(str(base), relative))
    assert within(landed, str(base))
    in_home = [layout.home / posixpath.relpath(private, HOME) for private in OPENCODE_IN_HOME]
    for ours in (layout.agent_home, layout.grader_dir, layout.control, layout.private, layout.sockets, *in_home):
        assert not within(landed, str(ours))
