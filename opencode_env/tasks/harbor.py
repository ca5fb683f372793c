"""Harbor task directories as rollout requests.

A task directory holds `instruction.md` (the prompt, verbatim), `task.toml` (schema "1.0" or "1.1"),
`environment/` (a Dockerfile and its build context, or `[environment] docker_image`), `tests/` (`test.sh`, which
writes /logs/verifier/reward.txt or reward.json, and its helpers) and optionally `solution/solve.sh` (the oracle).
What of a task cannot be carried over exactly is listed in `HarborTask.unsupported`; what cannot be carried at all
raises `TaskFormatError`.
"""

from __future__ import annotations

import re
import stat
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from opencode_env.tasks.image_build import ImageBuilder, ImageBuildError
from opencode_env.wire.models import (
    MAX_FILE_CHARS,
    MAX_FILES,
    MAX_FILES_TOTAL_CHARS,
    MAX_INSTRUCTION_CHARS,
    RESERVED_ENV,
    Network,
    RolloutRequest,
    VerifyAs,
)

VERIFY_COMMAND = "bash /tests/test.sh"
SOLUTION_COMMAND = "bash /solution/solve.sh"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
HarborNetworkMode = Literal["public", "no-network", "allowlist"]
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])I?B?\s*$", re.IGNORECASE)
_MIB_PER_UNIT = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


class TaskFormatError(ValueError):
    """A task directory that cannot be read as a Harbor task; the message names the file and the field."""


def parse_size_mb(text: str) -> int:
    """A Harbor size ("4G", "512M", "1.5G", "2048K") in MiB."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"bad size {text!r} (expected a number and a unit, like '4G' or '512M')")
    return int(float(match.group(1)) * _MIB_PER_UNIT[match.group(2).upper()])


class _Table(BaseModel):
    """A task.toml table: unknown keys are kept (in `model_extra`) and listed as unsupported."""

    model_config = ConfigDict(extra="allow")


class TaskInfo(_Table):
    name: str = ""
    description: str = ""
    authors: list[Any] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class VerifierConfig(_Table):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    network_mode: HarborNetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)

    @field_validator("env")
    @classmethod
    def _names_are_not_reserved(cls, env: dict[str, str]) -> dict[str, str]:
        reserved = sorted(name for name in env if name in RESERVED_ENV or name.startswith("OPENCODE"))
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: reserved by opencode-env (PATH, HOME, USER, TMPDIR, ...)")
        return env


class AgentConfig(_Table):
    timeout_sec: float | None = Field(None, gt=0)
    user: str | int | None = None
    network_mode: HarborNetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)


class EnvironmentConfig(_Table):
    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    cpus: float = Field(1, gt=0)
    memory_mb: int = Field(2048, gt=0)
    storage_mb: int = Field(10240, gt=0)
    memory: int | None = Field(None, description="MiB, parsed from Harbor's older size string ('4G'); wins.")
    storage: int | None = Field(None, description="MiB, parsed from Harbor's older size string ('10G'); wins.")
    gpus: int = Field(0, ge=0)
    allow_internet: bool = True
    network_mode: HarborNetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)

    @field_validator("memory", "storage", mode="before")
    @classmethod
    def _size_in_mb(cls, value: object) -> object:
        return parse_size_mb(value) if isinstance(value, str) else value

    @property
    def effective_memory_mb(self) -> int:
        return self.memory if self.memory is not None else self.memory_mb

    @property
    def effective_storage_mb(self) -> int:
        return self.storage if self.storage is not None else self.storage_mb


class SolutionConfig(_Table):
    env: dict[str, str] = Field(default_factory=dict)


class TaskConfig(_Table):
    version: str = "1.0"
    task: TaskInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)
    source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _schema_version_is_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and "schema_version" in data and "version" not in data:
            return {"version": data["schema_version"], **{k: v for k, v in data.items() if k != "schema_version"}}
        return data

    @field_validator("version")
    @classmethod
    def _version_one(cls, version: str) -> str:
        if not version.startswith("1."):
            raise ValueError(f"schema version {version!r} is not supported (1.0 and 1.1 are)")
        return version

    @property
    def network(self) -> Network:
        mode = self.environment.network_mode
        if mode is None:
            return "internet" if self.environment.allow_internet else "model_only"
        return "model_only" if mode == "no-network" else "internet"

    @property
    def verify_as(self) -> VerifyAs:
        return "root" if self.verifier.user in (None, "root", 0) else "grader"


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
        config = _read_config(path / "task.toml")
        verify_files, executables = _read_tree(path / "tests", "/tests")
        if "/tests/test.sh" not in verify_files:
            raise TaskFormatError(f"{path / 'tests' / 'test.sh'}: missing (the verifier Harbor runs)")
        return cls(
            path=path,
            task_id=task_id_of(path),
            instruction=_read_instruction(path / "instruction.md"),
            config=config,
            verify_files=verify_files,
            dockerfile=_environment_dockerfile(path / "environment", config.environment.docker_image),
            unsupported=_deviations(config) + _executable_notes(executables, keep={"/tests/test.sh"}),
        )

    @property
    def has_solution(self) -> bool:
        return (self.path / "solution" / "solve.sh").is_file()

    def require_solution(self) -> None:
        if not self.has_solution:
            raise TaskFormatError(f"{self.path / 'solution' / 'solve.sh'}: missing, so the task has no oracle")

    def solution_files(self) -> dict[str, str]:
        """solution/, keyed /solution/<relative path> (read on demand: only an oracle run needs it)."""
        self.require_solution()
        return _read_tree(self.path / "solution", "/solution")[0]

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
        if oracle:
            fields["files"] = self.solution_files()
            fields["solution"] = [SOLUTION_COMMAND]
            fields["env"] = {**fields["env"], **config.solution.env}
        return fields


def request_from_task_dir(
    path: Path, *, oracle: bool = False, builder: ImageBuilder | None = None, **overrides: Any
) -> RolloutRequest:
    """The rollout request of the Harbor task at `path`, its image taken from local container storage or built."""
    task = HarborTask.from_dir(path)
    if oracle:
        task.require_solution()
    image, workdir = task_image(task, builder or ImageBuilder())
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


def _read_config(path: Path) -> TaskConfig:
    if not path.is_file():
        raise TaskFormatError(f"{path}: missing")
    try:
        data = tomllib.loads(_read_text(path))
    except tomllib.TOMLDecodeError as error:
        raise TaskFormatError(f"{path}: not valid TOML: {error}") from error
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


def _read_instruction(path: Path) -> str:
    if not path.is_file():
        raise TaskFormatError(f"{path}: missing (the agent's instruction)")
    instruction = _read_text(path)
    if not instruction.strip():
        raise TaskFormatError(f"{path}: empty")
    if len(instruction) > MAX_INSTRUCTION_CHARS:
        raise TaskFormatError(f"{path}: {len(instruction)} characters, over the limit of {MAX_INSTRUCTION_CHARS}")
    return instruction


def _read_text(path: Path) -> str:
    """The file's text exactly as written (no newline translation); binary content is refused."""
    data = path.read_bytes()
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


def _read_tree(root: Path, mount: str) -> tuple[dict[str, str], list[str]]:
    """Every file under root as {mount/relative path: text}, and the keys of executable files."""
    if not root.is_dir():
        raise TaskFormatError(f"{root}: missing directory")
    files: dict[str, str] = {}
    executables: list[str] = []
    total = 0
    for path in sorted(_files_under(root)):
        if len(files) == MAX_FILES:
            raise TaskFormatError(f"{root}: more than {MAX_FILES} files (the limit of a request)")
        text = _read_text(path)
        if len(text) > MAX_FILE_CHARS:
            raise TaskFormatError(f"{path}: {len(text)} characters, over the limit of {MAX_FILE_CHARS} per file")
        total += len(text)
        if total > MAX_FILES_TOTAL_CHARS:
            raise TaskFormatError(f"{root}: over {MAX_FILES_TOTAL_CHARS} characters in all (at {path})")
        key = f"{mount}/{path.relative_to(root).as_posix()}"
        files[key] = text
        if path.stat().st_mode & stat.S_IXUSR:
            executables.append(key)
    return files, executables


def _files_under(root: Path) -> list[Path]:
    found: list[Path] = []
    pending = [root]
    while pending:
        for child in pending.pop().iterdir():
            if child.is_symlink():
                raise TaskFormatError(f"{child}: a symbolic link (not supported: copy the file in its place)")
            if child.is_dir():
                pending.append(child)
            elif child.is_file():
                found.append(child)
            else:
                raise TaskFormatError(f"{child}: not a regular file")
    return found


def _environment_dockerfile(environment: Path, docker_image: str | None) -> Path | None:
    for name in COMPOSE_FILES:
        if (environment / name).exists():
            raise TaskFormatError(
                f"{environment / name}: docker-compose environments are not supported (one container per "
                "rollout: give the task an environment/Dockerfile or a docker_image)"
            )
    dockerfile = environment / "Dockerfile"
    if dockerfile.is_file():
        return dockerfile
    if docker_image:
        return None
    raise TaskFormatError(f"{dockerfile}: missing, and task.toml sets no [environment] docker_image")


def _deviations(config: TaskConfig) -> list[str]:
    notes = _unknown_keys(config)
    if config.version not in ("1.0", "1.1"):
        notes.append(f"version = {config.version!r}: read as 1.1")
    if config.verify_as == "grader":
        notes.append(f"[verifier] user = {config.verifier.user!r}: verify runs as our unprivileged grader identity")
    if config.verifier.env:
        notes.append("[verifier] env: set for every phase (setup, agent, verify), not for verify alone")
    notes += [
        f"[verifier] env.{name}: the ${{...}} template is passed verbatim, not resolved from the host"
        for name, value in config.verifier.env.items()
        if "${" in value
    ]
    if config.solution.env:
        notes.append("[solution] env: set for every phase of an oracle run")
    for section, table in (("verifier", config.verifier), ("agent", config.agent)):
        if table.network_mode is not None or table.allowed_hosts:
            notes.append(f"[{section}] network_mode/allowed_hosts: no per-phase network; [environment]'s applies")
    if config.agent.user is not None:
        notes.append(f"[agent] user = {config.agent.user!r}: not supported; the agent runs as the sandbox's user")
    if config.environment.network_mode == "allowlist" or config.environment.allowed_hosts:
        notes.append("[environment] allowed_hosts: host allow-lists are not supported; network is 'internet'")
    if config.environment.gpus:
        notes.append(f"[environment] gpus = {config.environment.gpus}: no GPUs are provided")
    return notes


def _unknown_keys(config: TaskConfig) -> list[str]:
    notes = [f"{key}: unknown key, ignored" for key in config.model_extra or {}]
    tables: list[tuple[str, _Table | None]] = [
        ("task", config.task),
        ("verifier", config.verifier),
        ("agent", config.agent),
        ("environment", config.environment),
        ("solution", config.solution),
    ]
    for section, table in tables:
        if table is not None:
            notes += [f"[{section}] {key}: not supported, ignored" for key in table.model_extra or {}]
    return notes


def _executable_notes(executables: list[str], *, keep: set[str]) -> list[str]:
    return [
        f"{key}: the executable bit is not kept (protected files are written as text; run it with its interpreter)"
        for key in executables
        if key not in keep
    ]
