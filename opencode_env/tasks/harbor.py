"""Harbor task directories as rollout requests.

A task directory holds `instruction.md` (the prompt, verbatim), `task.toml` (schema "1.0" or "1.1"),
`environment/` (a Dockerfile and its build context, or `[environment] docker_image`), `tests/` (`test.sh`, which
writes /logs/verifier/reward.txt or reward.json, and its helpers) and optionally `solution/solve.sh` (the oracle).
What of a task cannot be carried over exactly is listed in `HarborTask.unsupported`; what cannot be carried at all
raises `TaskFormatError`. The task.toml schema is in task_toml.py. A task whose task.toml has our `[verifier.tests]`
table (test ids that must pass) is graded by the product's test grader over its tests/ files instead of by test.sh,
in the grader's box; a test.sh task is graded in the agent's box (it may check a service or a package the agent
set up), unless its task.toml says `[verifier] sandbox = "fresh"`. The result's grade_isolation says which.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from opencode_env.sandbox.local.build.builder import BuildProgress, ImageBuilder, ImageBuildError
from opencode_env.settings import Settings
from opencode_env.tasks.task_files import TaskDir, TaskFormatError
from opencode_env.tasks.task_toml import TaskConfig, VerifierTests, deviations
from opencode_env.wire import (
    MAX_FILE_CHARS,
    MAX_FILES,
    MAX_FILES_TOTAL_CHARS,
    MAX_INSTRUCTION_CHARS,
    RolloutRequest,
)
from opencode_env.wire.bounded_parse import TASK_TOML, ParseLimit, loads_toml

VERIFY_COMMAND = "bash /tests/test.sh"
SOLUTION_COMMAND = "bash /solution/solve.sh"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
MAX_TOML_BYTES = 1 << 20
__all__ = ["HarborTask", "TaskFormatError", "request_from_task_dir"]


class HarborTask(BaseModel):
    """A Harbor task directory, read and checked; `to_request` makes a rollout of it."""

    path: Path
    task_id: str
    instruction: str
    config: TaskConfig
    verify_files: dict[str, str] = Field(description="tests/, keyed /tests/<relative path>.")
    dockerfile: Path | None = Field(description="environment/Dockerfile, when there is one.")
    unsupported: list[str] = Field(
        default_factory=list, description="What of the task is ignored or carried over with a deviation."
    )

    @classmethod
    def from_dir(cls, path: Path) -> HarborTask:
        if not path.is_dir():
            raise TaskFormatError(f"{path}: not a directory")
        task_dir = TaskDir(path)
        config = _read_config(task_dir)
        verify_files, executables = _read_tree(task_dir, "tests")
        if "/tests/test.sh" not in verify_files:
            raise TaskFormatError(f"{path / 'tests' / 'test.sh'}: missing (the verifier Harbor runs)")
        return cls(
            path=path,
            task_id=task_id_of(path),
            instruction=_read_instruction(task_dir),
            config=config,
            verify_files=verify_files,
            dockerfile=_environment_dockerfile(task_dir, config.environment.docker_image),
            unsupported=deviations(config) + _executable_notes(executables, keep={"/tests/test.sh"}),
        )

    @property
    def has_solution(self) -> bool:
        return TaskDir(self.path).kind("solution/solve.sh") == "file"

    def require_solution(self) -> None:
        if not self.has_solution:
            raise TaskFormatError(f"{self.path / 'solution' / 'solve.sh'}: missing, so the task has no oracle")

    def solution_files(self) -> dict[str, str]:
        """solution/, keyed /solution/<relative path> (read on demand: only an oracle run needs it)."""
        self.require_solution()
        return _read_tree(TaskDir(self.path), "solution")[0]

    def to_request(self, image: str, workdir: str, *, oracle: bool = False, **overrides: Any) -> RolloutRequest:
        """The rollout of this task in `image`, the agent working in `workdir` ('' or '/': our default); oracle
        runs solution/solve.sh in place of the agent. `overrides` (model, base_url, ...) are applied last."""
        fields = self._request_fields(image, workdir, oracle=oracle)
        try:
            RolloutRequest.model_validate(fields)
        except ValidationError as error:
            raise TaskFormatError(f"{self.path}: the task does not fit a rollout request: {error}") from error
        return RolloutRequest.model_validate({**fields, **overrides})

    def _request_fields(self, image: str, workdir: str, *, oracle: bool) -> dict[str, Any]:
        config = self.config
        fields: dict[str, Any] = {
            "task_id": self.task_id,
            "instruction": self.instruction,
            "image": image,
            "workdir": agent_workdir(workdir),
            "verify": [VERIFY_COMMAND],
            "verify_files": dict(self.verify_files),
            "reward_files": ["reward.txt", "reward.json"],
            "verify_as": config.verify_as,
            "verify_timeout_s": config.verifier.timeout_sec,
            "env": dict(config.verifier.env),
            "network": config.network,
            "memory_mb": config.environment.effective_memory_mb,
            "disk_mb": config.environment.effective_storage_mb,
            "cpus": config.environment.cpus,
        }
        if config.agent.timeout_sec is not None:
            fields["agent_timeout_s"] = config.agent.timeout_sec
        if config.verifier.tests is not None:
            fields |= self._graded_tests(config.verifier.tests)
        fields["verify_sandbox"] = config.verifier.sandbox or ("fresh" if config.verifier.tests is not None else "same")
        if oracle:
            fields["files"] = self.solution_files()
            fields["solution"] = [SOLUTION_COMMAND]
            fields["env"] = {**fields["env"], **config.solution.env}
        return fields

    def _graded_tests(self, tests: VerifierTests) -> dict[str, Any]:
        """`[verifier.tests]`: tests/ (but test.sh) handed to the product's test grader, which runs them in place of
        test.sh."""
        files = {
            path.removeprefix("/tests/"): text for path, text in self.verify_files.items() if path != "/tests/test.sh"
        }
        graded = {"files": files, **tests.model_dump(include={"fail_to_pass", "pass_to_pass", "scoring"})}
        return {"tests": graded, "verify": [], "verify_files": {}}


def request_from_task_dir(
    path: Path,
    *,
    oracle: bool = False,
    builder: ImageBuilder | None = None,
    progress: BuildProgress | None = None,
    **overrides: Any,
) -> RolloutRequest:
    """The rollout request of the Harbor task at `path`, its image taken from local container storage or built (what
    the build does to `progress`, with the builder made here)."""
    task = HarborTask.from_dir(path)
    if oracle:
        task.require_solution()
    image, workdir = task_image(task, builder or ImageBuilder.for_settings(Settings.load(), progress=progress))
    return task.to_request(image, workdir, oracle=oracle, **overrides)


def task_image(task: HarborTask, builder: ImageBuilder) -> tuple[str, str]:
    """(image ref, its WORKDIR): `docker_image` when it is in local storage, else environment/ built (no pulls)."""
    prebuilt = task.config.environment.docker_image
    if prebuilt and builder.image_exists(prebuilt):
        return prebuilt, builder.image_workdir(prebuilt)
    if task.dockerfile is None:
        raise ImageBuildError(
            f"{task.path}: docker_image {prebuilt!r} is not in this machine's container storage and environment/ has "
            f"no Dockerfile to build (images are never pulled: `podman pull {prebuilt}` first)"
        )
    timeout_s = task.config.environment.build_timeout_sec
    built = builder.build(task.dockerfile.parent, name=task.task_id, timeout_s=timeout_s)
    return built.ref, built.workdir


def task_id_of(path: Path) -> str:
    """The directory's name, with characters a task id does not allow replaced by '-'."""
    return re.sub(r"[^A-Za-z0-9._:@+/-]", "-", path.resolve().name)[:256]


def agent_workdir(image_workdir: str) -> str:
    """An image's WORKDIR as the request's workdir: '' (our default work dir) for none or '/'."""
    stripped = image_workdir.strip()
    return "" if stripped in ("", "/") else stripped.rstrip("/")


def _read_config(task_dir: TaskDir) -> TaskConfig:
    path = task_dir.path / "task.toml"
    if task_dir.kind("task.toml") != "file":
        raise TaskFormatError(f"{path}: missing")
    try:
        data = loads_toml(_read_text(task_dir, "task.toml", MAX_TOML_BYTES), where=str(path), limits=TASK_TOML)
    except tomllib.TOMLDecodeError as error:
        raise TaskFormatError(f"{path}: not valid TOML: {error}") from error
    except ParseLimit as error:
        raise TaskFormatError(str(error)) from None
    try:
        return TaskConfig.model_validate(data)
    except ValidationError as error:
        raise TaskFormatError(f"{path}: {_config_problems(error)}") from error


def _config_problems(error: ValidationError) -> str:
    problems = []
    for detail in error.errors():
        location = [str(part) for part in detail["loc"]]
        where = f"[{location[0]}] {'.'.join(location[1:])}" if len(location) > 1 else "".join(location)
        problems.append(f"{where or 'top level'}: {detail['msg']}")
    return "; ".join(problems)


def _read_instruction(task_dir: TaskDir) -> str:
    path = task_dir.path / "instruction.md"
    if task_dir.kind("instruction.md") != "file":
        raise TaskFormatError(f"{path}: missing (the agent's instruction)")
    instruction = _read_text(task_dir, "instruction.md", 4 * MAX_INSTRUCTION_CHARS)
    if not instruction.strip():
        raise TaskFormatError(f"{path}: empty")
    if len(instruction) > MAX_INSTRUCTION_CHARS:
        raise TaskFormatError(f"{path}: {len(instruction)} characters, over the limit of {MAX_INSTRUCTION_CHARS}")
    return instruction


def _read_text(task_dir: TaskDir, relative: str, limit: int) -> str:
    """The file's text exactly as written (no newline translation); binary content is refused."""
    path = task_dir.path / relative
    data = task_dir.read_bytes(relative, limit)
    nul = data.find(b"\x00")
    if nul >= 0:
        raise _binary_file(path, f"a NUL byte at byte {nul}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _binary_file(path, f"not UTF-8 at byte {error.start}") from error


def _binary_file(path: Path, why: str) -> TaskFormatError:
    return TaskFormatError(
        f"{path}: a binary file ({why}); binary fixtures are not supported: the files sent into a sandbox are text only"
    )


def _read_tree(task_dir: TaskDir, name: str) -> tuple[dict[str, str], list[str]]:
    """Every file under the task's directory `name` as {/name/relative path: text}, and the keys of executables."""
    root = task_dir.path / name
    if task_dir.kind(name) != "dir":
        raise TaskFormatError(f"{root}: missing directory")
    files: dict[str, str] = {}
    executables: list[str] = []
    total = 0
    for relative in task_dir.files_under(name):
        path = task_dir.path / relative
        if len(files) == MAX_FILES:
            raise TaskFormatError(f"{root}: more than {MAX_FILES} files (the limit of a request)")
        text = _read_text(task_dir, relative, 4 * MAX_FILE_CHARS)
        if len(text) > MAX_FILE_CHARS:
            raise TaskFormatError(f"{path}: {len(text)} characters, over the limit of {MAX_FILE_CHARS} per file")
        total += len(text)
        if total > MAX_FILES_TOTAL_CHARS:
            raise TaskFormatError(f"{root}: over {MAX_FILES_TOTAL_CHARS} characters in all (at {path})")
        key = f"/{relative}"
        files[key] = text
        if task_dir.is_executable(relative):
            executables.append(key)
    return files, executables


def _environment_dockerfile(task_dir: TaskDir, docker_image: str | None) -> Path | None:
    """environment/Dockerfile, when there is one; environment/ is walked whole, so a link anywhere in the build
    context is refused here, before any build."""
    environment = task_dir.path / "environment"
    if task_dir.kind("environment") == "dir":
        for relative, _ in task_dir.walk("environment"):
            if relative.removeprefix("environment/") in COMPOSE_FILES:
                raise TaskFormatError(
                    f"{task_dir.path / relative}: docker-compose environments are not supported (one container per "
                    "rollout: give the task an environment/Dockerfile or a docker_image)"
                )
        if task_dir.kind("environment/Dockerfile") == "file":
            return environment / "Dockerfile"
    if docker_image:
        return None
    raise TaskFormatError(f"{environment / 'Dockerfile'}: missing, and task.toml sets no [environment] docker_image")


def _executable_notes(executables: list[str], *, keep: set[str]) -> list[str]:
    return [
        f"{key}: the executable bit is not kept (protected files are written as text; run it with its interpreter)"
        for key in executables
        if key not in keep
    ]
