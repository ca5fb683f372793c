"""A Harbor task's task.toml (schema "1.0" or "1.1") as typed tables, and what of it a rollout cannot carry.

Unknown keys are kept (in each table's `model_extra`) so that `deviations` can list them with every setting that
is ignored or carried over with a deviation; harbor.py reads the file and maps the tables to a rollout request.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from opencode_env.sandbox.local.build.box import MAX_BUILD_TIMEOUT_S
from opencode_env.sandbox.local.build.builder import is_image_reference
from opencode_env.wire import RESERVED_ENV, Network, VerifyAs, VerifySandbox, loader_env_names

HarborNetworkMode = Literal["public", "no-network", "allowlist"]
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])I?B?\s*$", re.IGNORECASE)
_MIB_PER_UNIT = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_size_mb(text: str) -> int:
    """A Harbor size ("4G", "512M", "1.5G", "2048K") in MiB."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"bad size {text!r} (expected a number and a unit, like '4G' or '512M')")
    return int(float(match.group(1)) * _MIB_PER_UNIT[match.group(2).upper()])


class _Table(BaseModel):
    """A task.toml table: unknown keys are kept (in `model_extra`) and listed as unsupported."""

    model_config = ConfigDict(extra="allow")


def _checked_env(env: dict[str, str]) -> dict[str, str]:
    reserved = sorted(name for name in env if name in RESERVED_ENV or name.startswith("OPENCODE"))
    if reserved:
        raise ValueError(f"{', '.join(reserved)}: reserved by opencode-env (PATH, HOME, USER, TMPDIR, ...)")
    unsafe = loader_env_names(env)
    if unsafe:
        raise ValueError(
            f"{', '.join(unsafe)}: refused (variables the loader, a shell or an interpreter reads at start-up: "
            "LD_*, BASH_ENV, ENV, PYTHONSTARTUP, PERL5OPT, NODE_OPTIONS, ...)"
        )
    return env


class TaskInfo(_Table):
    name: str = ""
    description: str = ""
    authors: list[Any] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class VerifierTests(_Table):
    """Ours (Harbor ignores it): the ids of the task's tests/ that must pass, graded by the product's test grader in
    place of tests/test.sh (whose exit code and reward file the code under test could fake)."""

    fail_to_pass: list[str] = Field(default_factory=list)
    pass_to_pass: list[str] = Field(default_factory=list)
    scoring: Literal["all", "fraction"] = "all"


class VerifierConfig(_Table):
    timeout_sec: float = Field(600.0, gt=0)
    tests: VerifierTests | None = None
    sandbox: VerifySandbox | None = Field(
        None,
        description="Ours (Harbor ignores it): where verify runs. fresh: the grader's box, fed a copy of the work "
        "dir; same: the agent's box. Unset: fresh with [verifier.tests], same for test.sh (it may grade state only "
        "the agent's box has, as Harbor does).",
    )
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    network_mode: HarborNetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)

    @field_validator("env")
    @classmethod
    def _names_are_safe(cls, env: dict[str, str]) -> dict[str, str]:
        return _checked_env(env)


class AgentConfig(_Table):
    timeout_sec: float | None = Field(None, gt=0)
    user: str | int | None = None
    network_mode: HarborNetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)


class EnvironmentConfig(_Table):
    build_timeout_sec: float = Field(600.0, gt=0, le=MAX_BUILD_TIMEOUT_S)
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

    @field_validator("docker_image")
    @classmethod
    def _an_image_reference(cls, image: str | None) -> str | None:
        if image is not None and not is_image_reference(image):
            raise ValueError(f"{image[:80]!r} is not an image reference (like 'debian:bookworm' or 'ghcr.io/o/n:tag')")
        return image

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

    @field_validator("env")
    @classmethod
    def _names_are_safe(cls, env: dict[str, str]) -> dict[str, str]:
        return _checked_env(env)


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


def deviations(config: TaskConfig) -> list[str]:
    notes = _unknown_keys(config)
    if config.version not in ("1.0", "1.1"):
        notes.append(f"version = {config.version!r}: read as 1.1")
    if config.verify_as == "grader":
        notes.append(f"[verifier] user = {config.verifier.user!r}: verify runs as our unprivileged grader identity")
    if config.verifier.env:
        notes.append("[verifier] env: set for every phase (setup, agent, verify), not for verify alone")
    if config.verifier.tests is not None:
        notes.append("[verifier] tests: graded by the listed test ids; tests/test.sh is not run")
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
        ("verifier.tests", config.verifier.tests),
        ("agent", config.agent),
        ("environment", config.environment),
        ("solution", config.solution),
    ]
    for section, table in tables:
        if table is not None:
            notes += [f"[{section}] {key}: not supported, ignored" for key in table.model_extra or {}]
    return notes
