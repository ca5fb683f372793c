"""A Harbor task's task.toml (schema "1.0" or "1.1") as typed tables, and what of it a rollout cannot carry.

Unknown keys are kept (in each table's `model_extra`) so that `unknown_keys` can name them, each with the known
key nearest to it (a misspelt `timeout_secs` is not silently ignored), and `deviations` lists every setting that is
carried over with a deviation; `refusals` names the features a rollout cannot carry at all. harbor.py reads the
file and maps the tables to a rollout request.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from opencode_env.sandbox.local.services import MAX_BUILD_TIMEOUT_S, is_image_reference
from opencode_env.wire import RESERVED_ENV, Network, VerifyAs, VerifySandbox, loader_env_names
from opencode_env.wire.grading import TestMode
from opencode_env.wire.mcp import MAX_MCP_SERVERS, McpServer
from opencode_env.wire.request import EnvName, EnvValue
from opencode_env.wire.steps import MAX_STEPS, MinReward, StepName, StepReward

TaskEnv = dict[EnvName, EnvValue]
HARBOR_ARTIFACTS = "/logs/artifacts"
"""Where Harbor's agents and verifiers leave files to keep: collected with every task's artifacts."""

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


def _checked_env(env: TaskEnv) -> TaskEnv:
    if "PATH" in env:
        raise ValueError(
            "PATH: reserved by opencode-env (our programs' PATH); set it in the image instead (`ENV PATH=/app/.venv/"
            "bin:$PATH` in environment/Dockerfile): the task's commands and the agent's tools get the image's PATH"
        )
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
    unmutated: list[str] = Field(default_factory=list)
    mode: TestMode = "auto"
    call_timeout_s: float = Field(30.0, gt=0, le=3600)


class VerifierConfig(_Table):
    timeout_sec: float = Field(600.0, gt=0)
    tests: VerifierTests | None = None
    sandbox: VerifySandbox | None = Field(
        None,
        description="Ours (Harbor ignores it): where verify runs. fresh: the grader's box, fed a copy of the work "
        "dir; same: the agent's box. Unset: fresh with [verifier.tests], same for test.sh (it may grade state only "
        "the agent's box has, as Harbor does).",
    )
    env: TaskEnv = Field(default_factory=dict, description="Set for verify alone (Harbor's verifier env).")
    user: str | int | None = None
    network_mode: HarborNetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    collect: list[Any] = Field(default_factory=list)
    reward_range: tuple[float, float] | None = Field(
        None, description="Ours (Harbor ignores it): the range a reward lies in (default [0, 1]); outside it grades 0."
    )
    reward_key: str | None = Field(
        None, description="Ours (Harbor ignores it): which key of a multi-metric reward.json is the reward."
    )

    @field_validator("env")
    @classmethod
    def _names_are_safe(cls, env: TaskEnv) -> TaskEnv:
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
    gpu_types: list[str] | None = None
    os: str = "linux"
    allow_internet: bool = True
    network_mode: HarborNetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    workdir: str | None = Field(None, description="The agent's work dir, in place of the image's WORKDIR.")
    env: TaskEnv = Field(default_factory=dict, description="The container's environment: every phase has it.")
    skills_dir: str | None = None
    mcp_servers: list[McpServer] = Field(
        default_factory=list,
        max_length=MAX_MCP_SERVERS,
        description="Given to OpenCode: stdio through the agent's tools' shell, sse/streamable-http at a service.",
    )
    healthcheck: dict[str, Any] | None = None

    @field_validator("env")
    @classmethod
    def _names_are_safe(cls, env: TaskEnv) -> TaskEnv:
        return _checked_env(env)

    @field_validator("workdir")
    @classmethod
    def _an_absolute_path(cls, workdir: str | None) -> str | None:
        if workdir is not None and not re.fullmatch(r"(/[A-Za-z0-9._@+-]+)+/?", workdir):
            raise ValueError(f"{workdir[:80]!r} is not an absolute path of letters, digits and ._@+- (like '/app')")
        if workdir is not None and any(part == ".." for part in workdir.split("/")):
            raise ValueError(f"{workdir[:80]!r} has a '..' component")
        return workdir

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
    env: TaskEnv = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _names_are_safe(cls, env: TaskEnv) -> TaskEnv:
        return _checked_env(env)


class ArtifactSource(_Table):
    """Harbor's table form of an artifact: `source` is collected; `destination` (a name in Harbor's trial
    directory) is not used: the result keys each file by its path in the sandbox."""

    source: str
    destination: str | None = None


class StepAgentConfig(_Table):
    timeout_sec: float | None = Field(None, gt=0, le=86_400)
    user: str | int | None = None


class StepVerifierConfig(_Table):
    timeout_sec: float | None = Field(None, gt=0, le=86_400)
    env: TaskEnv = Field(default_factory=dict, description="Set for this step's verify alone, over [verifier] env.")
    user: str | int | None = None
    environment_mode: Literal["shared", "separate"] | None = None
    environment: dict[str, Any] | None = None

    @field_validator("env")
    @classmethod
    def _names_are_safe(cls, env: TaskEnv) -> TaskEnv:
        return _checked_env(env)


class StepConfig(_Table):
    """One `[[steps]]` entry: its files are steps/<name>/ (instruction.md, tests/, solution/, workdir/)."""

    name: StepName
    min_reward: MinReward | None = None
    agent: StepAgentConfig = Field(default_factory=StepAgentConfig)
    verifier: StepVerifierConfig = Field(default_factory=StepVerifierConfig)
    healthcheck: dict[str, Any] | None = None
    artifacts: list[str | ArtifactSource] = Field(default_factory=list)


class TaskConfig(_Table):
    version: str = "1.0"
    task: TaskInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)
    source: str | None = None
    artifacts: list[str | ArtifactSource] = Field(
        default_factory=list, description="Paths collected after the trial (the result's artifacts)."
    )
    steps: list[StepConfig] = Field(
        default_factory=list, max_length=MAX_STEPS, description="Harbor's multi-step tasks, run in order."
    )
    multi_step_reward_strategy: StepReward | None = None

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

    @field_validator("steps")
    @classmethod
    def _named_once(cls, steps: list[StepConfig]) -> list[StepConfig]:
        names = [step.name for step in steps]
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"name {', '.join(twice)} declared twice (a step's name is its directory, steps/<name>)")
        return steps

    def artifact_paths(self, workdir: str) -> list[str]:
        """The artifacts' paths (the task's, then its steps'), absolute (a relative one under `workdir`), then
        Harbor's /logs/artifacts."""
        listed = [*self.artifacts, *(artifact for step in self.steps for artifact in step.artifacts)]
        paths = [artifact if isinstance(artifact, str) else artifact.source for artifact in listed]
        absolute = [path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}" for path in paths]
        return list(dict.fromkeys([*absolute, HARBOR_ARTIFACTS]))

    @property
    def network(self) -> Network:
        mode = self.environment.network_mode
        if mode is None:
            return "internet" if self.environment.allow_internet else "model_only"
        return "model_only" if mode == "no-network" else "internet"

    @property
    def verify_as(self) -> VerifyAs:
        return "root" if self.verifier.user in (None, "root", 0) else "grader"


def refusals(config: TaskConfig) -> list[str]:
    """The features of the task a rollout cannot carry at all, each named: the task is refused with them."""
    refused = []
    if config.steps and config.verifier.tests is not None:
        refused.append("[verifier] tests with [[steps]]: each step is graded by its own tests/test.sh")
    return refused


def deviations(config: TaskConfig) -> list[str]:
    notes: list[str] = []
    if config.version not in ("1.0", "1.1"):
        notes.append(f"version = {config.version!r}: read as 1.1")
    if config.verify_as == "grader":
        notes.append(f"[verifier] user = {config.verifier.user!r}: verify runs as our unprivileged grader identity")
    if config.verifier.tests is not None:
        notes.append("[verifier] tests: graded by the listed test ids; tests/test.sh is not run")
        if config.verifier.env:
            notes.append("[verifier] env: with [verifier.tests], set for every phase (setup, agent, verify)")
    notes += [
        f"[verifier] env.{name}: the ${{...}} template is passed verbatim, not resolved from the host"
        for name, value in {**config.verifier.env, **config.environment.env}.items()
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
    if config.environment.healthcheck is not None:
        notes.append("[environment] healthcheck: not run; the agent starts once setup has finished")
    if config.environment.os != "linux":
        notes.append(f"[environment] os = {config.environment.os!r}: sandboxes are Linux")
    if config.verifier.collect:
        notes.append("[verifier] collect: not collected apart; the work dir's files are in the result's files")
    if any(isinstance(artifact, ArtifactSource) and artifact.destination for artifact in config.artifacts):
        notes.append("artifacts: destination is not used; the result keys each file by its path in the sandbox")
    return notes + _step_deviations(config.steps)


def _step_deviations(steps: list[StepConfig]) -> list[str]:
    notes = []
    for step in steps:
        where = f"[[steps]] {step.name}"
        if step.agent.user is not None or step.verifier.user is not None:
            notes.append(f"{where}: agent/verifier user not supported; the rollout's identities apply")
        if step.verifier.environment_mode == "shared" or step.verifier.environment is not None:
            notes.append(f"{where}: verifier environment_mode/environment: each step is verified in a fresh box")
        if step.healthcheck is not None:
            notes.append(f"{where}: healthcheck not run; the agent starts once the step's setup has finished")
        if step.artifacts:
            notes.append(f"{where}: artifacts collected once, after the last step that ran (not after each step)")
    if steps:
        notes.append(
            "[[steps]]: each step is verified in a fresh grader's box fed the agent's work dir (not in the "
            "agent's container)"
        )
    return notes


def unknown_keys(config: TaskConfig) -> list[str]:
    """Each key task.toml has that Harbor's schema and ours do not, with the known key nearest to it."""
    tables: list[tuple[str, _Table | None]] = [
        ("", config),
        ("task", config.task),
        ("verifier", config.verifier),
        ("verifier.tests", config.verifier.tests),
        ("agent", config.agent),
        ("environment", config.environment),
        ("solution", config.solution),
    ]
    for step in config.steps:
        where = f"steps {step.name}"
        tables += [(where, step), (f"{where} agent", step.agent), (f"{where} verifier", step.verifier)]
    notes = []
    for section, table in tables:
        if table is None:
            continue
        known = [*type(table).model_fields, *(["schema_version"] if table is config else [])]
        for key in table.model_extra or {}:
            where = f"[{section}] {key}" if section else key
            nearest = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f" (did you mean {nearest[0]!r}?)" if nearest else ""
            notes.append(f"{where}: unknown key, ignored{hint}")
    return notes
