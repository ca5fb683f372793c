"""isolation.runtime_binds over generated host paths: whatever the host's runtime paths are, our programs start
from the read-only RUNTIME_MOUNT, nothing of the host lands on a directory a task writes, and those places keep
their modes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.local.isolation.bubblewrap import RUNTIME_MOUNT, SYSTEM_DIRS, TASK_WRITABLE, runtime_binds

COMPONENTS = st.sampled_from(["tmp", "home", "user", "opencode", "grader", "root", "opt", "work", "usr", "venv", "x"])
PATHS = st.lists(st.lists(COMPONENTS, min_size=1, max_size=5).map(lambda parts: "/" + "/".join(parts)), max_size=6)


def _under(path: str, place: str) -> bool:
    return path == place or path.startswith(place + "/")


def _pairs(argv: list[str], flag: str, arity: int) -> list[list[str]]:
    return [argv[index + 1 : index + 1 + arity] for index, word in enumerate(argv) if word == flag]


@given(paths=PATHS)
def test_runtime_paths_never_land_on_a_place_the_task_writes(paths: list[str]) -> None:
    paths = sorted(set(paths))
    if any(_under(place, path) for path in paths for place in TASK_WRITABLE):
        with pytest.raises(SandboxError, match="would cover a place"):
            runtime_binds(paths)
        return
    argv = runtime_binds(paths)
    shadows = [target for (target,) in _pairs(argv, "--tmpfs", 1) if target != RUNTIME_MOUNT]
    for source, target in _pairs(argv, "--ro-bind", 2):
        assert target in (RUNTIME_MOUNT + source, source)
        if target == source:
            assert not any(_under(source, system) for system in SYSTEM_DIRS)
            if any(_under(source, place) for place in TASK_WRITABLE):
                assert any(_under(source, shadow) for shadow in shadows), (source, shadows)
    for shadow in shadows:
        assert any(shadow.rsplit("/", 1)[0] == place for place in TASK_WRITABLE), shadow
        assert ["--remount-ro", shadow] in [argv[index : index + 2] for index in range(len(argv))]
    assert ["--remount-ro", RUNTIME_MOUNT] in [argv[index : index + 2] for index in range(len(argv))]
    changed = [target for _, target in _pairs(argv, "--chmod", 2)]
    assert not set(changed) & set(TASK_WRITABLE), changed
