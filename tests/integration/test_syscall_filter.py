"""The syscall filter: every denied class tried from inside a sandbox, as each identity, fails with EPERM (clone3 with
ENOSYS, so libc falls back to clone), while a normal workload (git, pip, pytest, threads, ptrace) still runs."""

from __future__ import annotations

import json
import platform
from collections.abc import AsyncIterator

import pytest

from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend, LocalSandbox
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.images.store import HOST_IMAGE
from opencode_env.scripted.script import Script, bash
from tests.helpers import rollout

TRY_DENIED = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
X86_64 = {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "keyctl": 250,
          "add_key": 248, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
          "kexec_load": 246, "init_module": 175, "swapon": 167, "reboot": 169, "settimeofday": 164,
          "open_by_handle_at": 304, "fsopen": 430, "open_tree": 428, "clone3": 435, "clone": 56}
ARGS = {"unshare": (0x10000000,), "setns": (0, 0), "mount": (b"none", b"/tmp", b"tmpfs", 0, 0),
        "clone": (0x10000000 | 17, 0, 0, 0, 0), "fsopen": (b"tmpfs", 0), "open_tree": (-100, b"/", 1),
        "pivot_root": (b"/tmp", b"/tmp"), "umount2": (b"/tmp", 0), "reboot": (0, 0, 0, 0),
        "perf_event_open": (0, 0, -1, -1, 0), "bpf": (0, 0, 0), "keyctl": (0, 0), "io_uring_setup": (1, 0)}
seen = {}
for name, number in X86_64.items():
    ctypes.set_errno(0)
    result = libc.syscall(number, *ARGS.get(name, ()))
    seen[name] = errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno())) if result == -1 else "allowed"
print(json.dumps(seen))
"""


def _expected() -> dict[str, str]:
    expected = {name: "EPERM" for name in ("unshare", "setns", "mount", "umount2", "pivot_root")}
    for name in ("keyctl", "add_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "kexec_load"):
        expected[name] = "EPERM"
    for name in ("init_module", "swapon", "reboot", "settimeofday", "open_by_handle_at", "fsopen", "open_tree"):
        expected[name] = "EPERM"
    expected["clone"], expected["clone3"] = "EPERM", "ENOSYS"
    return expected


@pytest.fixture(scope="module", params=["image", "host"])
def where(request: pytest.FixtureRequest) -> str:
    return build_base_image() if request.param == "image" else HOST_IMAGE


@pytest.fixture
async def filtered_box(backend: LocalBackend, where: str) -> AsyncIterator[LocalSandbox]:
    sandbox = await backend.create(SandboxSpec(image=where))
    try:
        yield sandbox
    finally:
        await sandbox.close()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe names x86_64 syscall numbers")
async def test_denied_syscalls_fail_for_every_identity(filtered_box: LocalSandbox) -> None:
    probe = await filtered_box.write_control_file("try_denied.py", TRY_DENIED)
    for identity in ("user", "root", "grader"):
        python = "python3" if filtered_box.image is not None else "/usr/bin/python3"
        ran = await filtered_box.run(f"{python} -I {probe}", timeout_s=60, cwd="/", identity=identity)
        assert ran.exit_code == 0, ran.stderr
        assert json.loads(ran.stdout) == _expected(), identity
        status = await filtered_box.run("grep Seccomp: /proc/self/status", timeout_s=60, identity=identity)
        assert status.stdout.split() == ["Seccomp:", "2"]


async def test_a_normal_workload_still_runs(backend: LocalBackend) -> None:
    sandbox = await backend.create(SandboxSpec(image=build_base_image()))
    try:
        workload = (
            "set -e; cd /home/user/workdir; git init -q . && git -c user.email=a@b -c user.name=a commit -q "
            "--allow-empty -m first; printf 'def test_ok():\\n    assert 1\\n' > test_ok.py; python -m pytest -q "
            "-p no:cacheprovider test_ok.py; pip --version >/dev/null; python -c 'import threading, concurrent.futures "
            "as f; print(sum(f.ThreadPoolExecutor(4).map(abs, range(-5, 5))))'; "
            "python -c 'import ctypes, os; libc = ctypes.CDLL(None); pid = os.fork()\n"
            "if pid == 0:\n    libc.ptrace(0, 0, 0, 0); os._exit(0)\n"
            'print("traced", os.waitpid(pid, 0)[1])\''
        )
        ran = await sandbox.run(workload, timeout_s=120)
        assert ran.exit_code == 0, ran.stderr
        assert "1 passed" in ran.stdout
        assert "25\n" in ran.stdout
        assert "traced 0" in ran.stdout
    finally:
        await sandbox.close()


async def test_the_agents_tools_run_under_the_filter(backend: LocalBackend) -> None:
    """OpenCode's bash tool tries to leave through a new user namespace; the filter answers EPERM."""
    script = Script(steps=[bash("unshare -U true 2> unshare.txt; grep Seccomp: /proc/self/status > status.txt")])
    outcome = await rollout(backend, script, verify=["true"])
    files = outcome.result.files
    assert outcome.result.status == "completed", outcome.result.error
    assert "Operation not permitted" in files["unshare.txt"]
    assert files["status.txt"].split() == ["Seccomp:", "2"]
