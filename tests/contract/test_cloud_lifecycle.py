"""The lifecycle the cloud backends share, over a provider whose VMs are names in a set: a slot from creation to
close, a VM killed whatever stops its creation or its preparation, tags for `reap`, closing once."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from opencode_env.sandbox.base import FileEntry, Identity, ProvidedTools, SandboxError, SandboxSpec
from opencode_env.sandbox.cloud import lifecycle
from opencode_env.sandbox.cloud.lifecycle import Lifecycle, Tags, provided_tools
from opencode_env.sandbox.cloud.sandbox import Capture, CloudSandbox
from opencode_env.wire import CommandResult

pytestmark = pytest.mark.timeout(30)


@dataclass(frozen=True)
class VM:
    id: str


class Exited:
    async def running(self) -> bool:
        return False

    async def kill(self) -> None:
        return None


class MemorySandbox(CloudSandbox):
    backend = "memory"

    def __init__(self, vm: VM, tools: ProvidedTools, spec: SandboxSpec, release: Callable[[], None], cloud: Cloud):
        super().__init__(vm.id, tools, spec, release)
        self.enforcement = {}
        self._vm = vm
        self._cloud = cloud
        self.root_exit = 0
        self.written: list[tuple[Identity, str, str | bytes]] = []

    async def _run_as(
        self, identity: Identity, cmd: str, *, timeout_s: float, env: Mapping[str, str] | None, cwd: str, limit: int
    ) -> CommandResult:
        capture = Capture(cmd, limit)
        capture.on_stdout(f"{identity} ran {cmd}")
        return capture.result(self.root_exit if identity == "root" else 0, timed_out=False)

    async def _start_as(self, identity: Identity, cmd: str, *, env: Mapping[str, str] | None, cwd: str) -> Exited:
        return Exited()

    async def _write_as(self, identity: Identity, path: str, data: str | bytes) -> None:
        self.written.append((identity, path, data))

    async def _kill_vm(self) -> None:
        await self._cloud.kill_vm(self._vm)

    async def write_control_file(self, name: str, data: str) -> str:
        await self.write_file(name, data)
        return name

    async def read_tail(self, path: str, limit: int) -> bytes:
        return b""

    async def read_file(self, path: str) -> bytes:
        raise FileNotFoundError(path)

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        return []


MEMORY_TAGS = Tags("marker", server="server", task="task", created="created", clean=lambda text: text[:8])


@dataclass
class Cloud:
    """The provider: `gate` holds creations back until it is set; the failure switches stop a step."""

    label: str = "Memory"
    cap_setting: str = "MEMORY_MAX_SANDBOXES"
    tags: Tags = field(default_factory=lambda: MEMORY_TAGS)
    start_timeout_s: float | None = None
    key: str = "key"
    gate: asyncio.Event | None = None
    create_failure: Exception | None = None
    prepare_failure: BaseException | None = None
    kill_failure: bool = False
    alive: set[str] = field(default_factory=set)
    created: list[dict[str, str]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def credential(self) -> str:
        if not self.key:
            raise SandboxError("no key for the memory cloud")
        return self.key

    async def create_vm(self, image: str, spec: SandboxSpec, tags: Mapping[str, str], credential: str) -> VM:
        if self.gate is not None:
            await self.gate.wait()
        if self.create_failure is not None:
            raise self.create_failure
        vm = VM(f"vm{next(self._ids)}")
        self.alive.add(vm.id)
        self.created.append(dict(tags))
        return vm

    def create_error(self, error: Exception, image: str) -> SandboxError:
        return SandboxError(f"the memory cloud could not create {image}: {error}")

    def vm_id(self, vm: Any) -> str:
        return str(vm.id)

    async def kill_vm(self, vm: Any) -> None:
        if self.kill_failure:
            raise SandboxError("the VM would not die")
        self.alive.discard(vm.id)

    async def prepare(self, vm: Any, spec: SandboxSpec, image: str) -> ProvidedTools:
        if self.prepare_failure is not None:
            raise self.prepare_failure
        return provided_tools("1.2.3", True)

    def open_sandbox(
        self, vm: Any, tools: ProvidedTools, spec: SandboxSpec, release: Callable[[], None]
    ) -> MemorySandbox:
        return MemorySandbox(vm, tools, spec, release, self)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_a_sandbox_holds_its_slot_until_it_closes() -> None:
    cloud = Cloud()
    backend = Lifecycle(cloud, limit=1, server_id="a host with spaces")
    first = await backend.create(SandboxSpec(task_id="task-with-a-long-name"), "image")
    assert first.tools == ProvidedTools("opencode", "1.2.3", "python3", proxy_ready=True)
    assert cloud.created[0]["marker"] == "1"
    assert (cloud.created[0]["server"], cloud.created[0]["task"]) == ("a host w", "task-wit")
    second = asyncio.ensure_future(backend.create(SandboxSpec(), "image"))
    await asyncio.sleep(0.3)
    assert not second.done()
    await first.close()
    await first.close()
    await asyncio.wait_for(second, timeout=5)
    assert cloud.alive == {second.result().sandbox_id}
    assert await backend.close_all() == 1
    assert (cloud.alive, await backend.close_all()) == (set(), 0)


async def test_an_agent_holds_one_slot_its_grader_a_second_and_a_cap_of_one_is_refused_naming_it() -> None:
    """Under a cap of 3 two agents graded apart run at once, one slot each; a third waits (an agent never takes the
    last slot a grader may need), while the first agent's grader, asked later, takes that slot at once. A cap of 1
    cannot hold an agent and its grader, and is refused before any VM exists, naming the setting and what to do."""
    cloud = Cloud()
    backend = Lifecycle(cloud, limit=3)
    first = await backend.create(SandboxSpec(grader_box="planned"), "image")
    second = await backend.create(SandboxSpec(grader_box="planned"), "image")
    third = asyncio.ensure_future(backend.create(SandboxSpec(grader_box="planned"), "image"))
    await asyncio.sleep(0.3)
    assert (len(cloud.alive), third.done()) == (2, False)
    grader = await asyncio.wait_for(backend.create(SandboxSpec(grader_box="this"), "image"), timeout=5)
    assert (len(cloud.alive), third.done()) == (3, False)
    await grader.close()
    await first.close()
    await (await asyncio.wait_for(third, timeout=5)).close()
    await second.close()
    small = Cloud()
    with pytest.raises(SandboxError, match=r"MEMORY_MAX_SANDBOXES=1 .*\(2: .*raise it to 2 or more, or ask for verify"):
        await Lifecycle(small, limit=1).create(SandboxSpec(grader_box="planned"), "image")
    assert small.created == []


async def test_a_creation_cancelled_midway_kills_its_vm_once_it_exists() -> None:
    cloud = Cloud(gate=asyncio.Event())
    backend = Lifecycle(cloud, limit=1)
    creating = asyncio.ensure_future(backend.create(SandboxSpec(), "image"))
    await asyncio.sleep(0.05)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    assert cloud.gate is not None
    cloud.gate.set()
    await until(lambda: len(cloud.created) == 1 and not cloud.alive)
    await (await asyncio.wait_for(backend.create(SandboxSpec(), "image"), timeout=5)).close()


async def test_a_creation_past_the_start_timeout_fails_and_its_vm_is_killed_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lifecycle, "START_GRACE_S", 0.0)
    cloud = Cloud(gate=asyncio.Event(), start_timeout_s=0.1)
    backend = Lifecycle(cloud, limit=1)
    with pytest.raises(SandboxError, match=r"the Memory sandbox \(image 'slow'\) was not ready within 0 s"):
        await backend.create(SandboxSpec(), "slow")
    assert cloud.gate is not None
    cloud.gate.set()
    await until(lambda: len(cloud.created) == 1 and not cloud.alive)


@pytest.mark.parametrize("failure", [SandboxError("the probe failed"), asyncio.CancelledError()])
async def test_a_vm_whose_preparation_stops_is_killed_and_frees_its_slot(failure: BaseException) -> None:
    cloud = Cloud(prepare_failure=failure)
    backend = Lifecycle(cloud, limit=1)
    with pytest.raises(type(failure)):
        await backend.create(SandboxSpec(), "image")
    assert (len(cloud.created), cloud.alive) == (1, set())
    cloud.prepare_failure = None
    await (await asyncio.wait_for(backend.create(SandboxSpec(), "image"), timeout=5)).close()


async def test_failures_before_a_vm_exists_are_the_providers_messages_and_hold_no_slot() -> None:
    cloud = Cloud(key="")
    backend = Lifecycle(cloud, limit=1)
    with pytest.raises(SandboxError, match="no key for the memory cloud"):
        await backend.create(SandboxSpec(), "image")
    cloud.key, cloud.create_failure = "key", OSError("connection refused")
    with pytest.raises(SandboxError, match="the memory cloud could not create image: connection refused"):
        await backend.create(SandboxSpec(), "image")
    cloud.create_failure = None
    await (await asyncio.wait_for(backend.create(SandboxSpec(), "image"), timeout=5)).close()


async def test_a_vm_that_will_not_die_is_logged_for_reap_and_its_slot_freed(caplog: pytest.LogCaptureFixture) -> None:
    cloud = Cloud()
    backend = Lifecycle(cloud, limit=1)
    box = await backend.create(SandboxSpec(), "image")
    cloud.kill_failure = True
    await box.close()
    assert "the VM would not die (opencode-env reap will find it)" in caplog.text
    assert caplog.records[-1].levelno == logging.ERROR
    cloud.kill_failure = False
    await (await asyncio.wait_for(backend.create(SandboxSpec(), "image"), timeout=5)).close()
    assert cloud.alive == {box.sandbox_id}, "the VM that would not die is left to reap"


async def test_a_closed_sandbox_refuses_commands() -> None:
    box = await Lifecycle(Cloud(), limit=1).create(SandboxSpec(), "image")
    await box.close()
    with pytest.raises(SandboxError, match=f"sandbox {box.sandbox_id} is closed"):
        await box.run("true", timeout_s=1)
    with pytest.raises(SandboxError, match="is closed"):
        await box.start("true", log_path="/tmp/log")


async def test_the_grader_hand_over_runs_as_root_then_writes_as_the_grader() -> None:
    box = await Lifecycle(Cloud(), limit=1).create(SandboxSpec(workdir="/home/user/work"), "image")
    try:
        await box.hand_to_grader({"tests/test_a.py": "assert True\n", "/tests/check": "x"})
        assert box.written == [
            ("grader", "/home/user/work/tests/test_a.py", "assert True\n"),
            ("grader", "/tests/check", "x"),
        ]
        with pytest.raises(SandboxError, match="outside the task's roots"):
            await box.hand_to_grader({"a.py": "", "/etc/check": "x"})
        assert len(box.written) == 2
        box.root_exit = 1
        with pytest.raises(SandboxError, match=f"could not hand the work dir to the grader in {box.sandbox_id}"):
            await box.hand_to_grader({})
    finally:
        await box.close()


def test_a_commands_output_is_bounded_head_and_tail() -> None:
    capture = Capture("noisy", 8)
    capture.on_stdout("0123456789")
    capture.on_stderr("err")
    capture.note("!")
    result = capture.result(None, timed_out=True)
    assert (result.stdout, result.stderr) == ("0123\n[... 2 bytes dropped ...]\n6789", "err!")
    assert (result.output_truncated, result.timed_out, result.exit_code) == (True, True, None)
