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

import collections
import logging
import re
import shlex
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from opencode_env.rollout.image_user import as_image_user
from opencode_env.sandbox.local.services import BuildProgress, ImageBuilder, ImageBuildError
from opencode_env.settings import Settings
from opencode_env.tasks.compose import ComposeError, ComposeFile, parse_compose
from opencode_env.tasks.compose_images import sidecar_services
from opencode_env.tasks.task_files import TaskDir, TaskFormatError
from opencode_env.tasks.task_toml import TaskConfig, VerifierTests, deviations, refusals, unknown_keys
from opencode_env.wire import (
    MAX_FILE_CHARS,
    MAX_FILES,
    MAX_FILES_TOTAL_CHARS,
    MAX_INSTRUCTION_CHARS,
    RolloutRequest,
)
from opencode_env.wire.bounded_parse import TASK_TOML, ParseLimit, loads_toml
from opencode_env.wire.mcp import STDIO_REFUSED
from opencode_env.wire.services import Service
from opencode_env.wire.task_paths import WORKDIR

VERIFY_COMMAND = "bash /tests/test.sh"
ENTRYPOINT_LOG = "/tmp/harbor-entrypoint.log"
ENTRYPOINT_START_S = 10
"""How long setup waits for the image's ENTRYPOINT to reach its `exec "$@"` (Harbor's command, `sleep infinity`)."""
VERIFIER_ENV_FILE = "/tests/.verifier-env"
"""`[verifier] env`, written in with the tests (after the agent ran, which never sees it) and read by verify alone."""
SOLUTION_COMMAND = "bash /solution/solve.sh"
STEP_SETUP = "setup.sh"
STEP_SETUP_COMMAND = f"bash ./{STEP_SETUP}"
"""A step's workdir/setup.sh, run from the work dir (where its workdir/ files were written) before its agent."""
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
MAX_TOML_BYTES = 1 << 20
MAX_COMPOSE_TEXT = 1 << 20
__all__ = ["HarborTask", "TaskFormatError", "request_from_task_dir"]
log = logging.getLogger("opencode_env.tasks.harbor")


class HarborStep(BaseModel):
    """One `[[steps]]` entry with its directory steps/<name>/ read: instruction.md, tests/ (over the task's),
    workdir/ (written into the work dir before the step; its setup.sh run then), solution/ (the step's oracle)."""

    name: str
    instruction: str
    verify_files: dict[str, str] = Field(description="The step's tests/, keyed /tests/<relative path>.")
    workdir_files: dict[str, str] = Field(description="workdir/, keyed by path relative to the work dir.")
    has_solution: bool


class HarborTask(BaseModel):
    """A Harbor task directory, read and checked; `to_request` makes a rollout of it."""

    path: Path
    task_id: str
    instruction: str
    config: TaskConfig
    verify_files: dict[str, str] = Field(description="tests/, keyed /tests/<relative path>.")
    dockerfile: Path | None = Field(description="environment/Dockerfile, when there is one.")
    compose: ComposeFile | None = Field(None, description="environment/docker-compose.yaml, when there is one.")
    unsupported: list[str] = Field(
        default_factory=list, description="What of the task is ignored or carried over with a deviation."
    )
    unknown: list[str] = Field(
        default_factory=list,
        description="task.toml's unknown keys, each with its nearest known key (in unsupported too).",
    )
    steps: list[HarborStep] = Field(default_factory=list, description="A multi-step task's steps, in order.")

    @classmethod
    def from_dir(cls, path: Path) -> HarborTask:
        if not path.is_dir():
            raise TaskFormatError(f"{path}: not a directory")
        task_dir = TaskDir(path)
        config = _read_config(task_dir)
        if refused := refusals(config):
            raise TaskFormatError(f"{path / 'task.toml'}: {'; '.join(refused)}")
        steps = _read_steps(task_dir, config)
        has_tests = task_dir.kind("tests") == "dir" or not steps
        verify_files, executables = _read_tree(task_dir, "tests") if has_tests else ({}, [])
        if not steps and "/tests/test.sh" not in verify_files:
            raise TaskFormatError(f"{path / 'tests' / 'test.sh'}: missing (the verifier Harbor runs)")
        for step in steps:
            if "/tests/test.sh" not in {**verify_files, **step.verify_files}:
                raise TaskFormatError(
                    f"{path / 'steps' / step.name / 'tests' / 'test.sh'}: missing, and tests/test.sh too (the step's "
                    "verifier)"
                )
        unknown = unknown_keys(config)
        compose = _read_compose(task_dir)
        return cls(
            path=path,
            task_id=task_id_of(path),
            instruction=steps[0].instruction if steps else _read_instruction(task_dir),
            steps=steps,
            config=config,
            verify_files=verify_files,
            dockerfile=_environment_dockerfile(task_dir, config.environment.docker_image),
            compose=compose,
            unsupported=[
                *unknown,
                *deviations(config),
                *_executable_notes(executables, keep={"/tests/test.sh"}),
                *(compose.noted if compose is not None else []),
            ],
            unknown=unknown,
        )

    def local_names(self) -> frozenset[str]:
        """The names that are the sandbox's own loopback: localhost, and a compose task's services."""
        names = {"localhost", "127.0.0.1"}
        if self.compose is not None:
            names |= {"main", *(n for s in self.compose.sidecars for n in (s.name, *s.aliases))}
        return frozenset(names)

    @property
    def has_solution(self) -> bool:
        if self.steps:
            return all(step.has_solution for step in self.steps)
        return TaskDir(self.path).kind("solution/solve.sh") == "file"

    def require_solution(self) -> None:
        for step in self.steps:
            if not step.has_solution:
                where = self.path / "steps" / step.name / "solution" / "solve.sh"
                raise TaskFormatError(f"{where}: missing, so step {step.name} has no oracle")
        if not self.has_solution:
            raise TaskFormatError(f"{self.path / 'solution' / 'solve.sh'}: missing, so the task has no oracle")

    def solution_files(self) -> dict[str, str]:
        """solution/, keyed /solution/<relative path> (read on demand: only an oracle run needs it)."""
        self.require_solution()
        return _read_tree(TaskDir(self.path), "solution")[0]

    def to_request(
        self,
        image: str,
        workdir: str,
        *,
        oracle: bool = False,
        entrypoint: Sequence[str] = (),
        services: Sequence[Service] = (),
        user: str = "",
        **overrides: Any,
    ) -> RolloutRequest:
        """The rollout of this task in `image`, the agent working in `[environment] workdir`, else `workdir` (the
        image's; '' or '/': our default); oracle runs solution/solve.sh in place of the agent. The image's
        `entrypoint` starts first, as Harbor's container does, before any `setup` the overrides add; `services`
        (the compose file's sidecars) run beside it. The image's `user` (its USER) runs the entrypoint and the oracle,
        as Docker runs a container's commands; the agent's tools run as our `user`. `overrides` (model, base_url, ...)
        are applied last."""
        fields = self._request_fields(image, workdir, oracle=oracle)
        if services:
            fields["services"] = [service.model_dump() for service in services]
        image_user = "" if user.strip() in ("", "root", "0", "0:0", "root:root") else user.strip()
        if image_user:
            fields["image_user"] = image_user
            if oracle:
                fields["solution_as"] = "image_user"
        if entrypoint:
            fields["setup"] = [entrypoint_command(entrypoint, user=image_user)]
        try:
            RolloutRequest.model_validate(fields)
        except ValidationError as error:
            raise TaskFormatError(f"{self.path}: the task does not fit a rollout request: {error}") from error
        if entrypoint and "setup" in overrides:
            overrides = {**overrides, "setup": [*fields["setup"], *overrides["setup"]]}
        return RolloutRequest.model_validate({**fields, **overrides})

    def _request_fields(self, image: str, workdir: str, *, oracle: bool) -> dict[str, Any]:
        config = self.config
        main = self.compose.main if self.compose is not None else None
        if main is not None:
            workdir = main.working_dir or workdir
        fields: dict[str, Any] = {
            "task_id": self.task_id,
            "instruction": self.instruction,
            "image": image,
            "workdir": agent_workdir(config.environment.workdir or workdir),
            "verify": [VERIFY_COMMAND],
            "verify_files": dict(self.verify_files),
            "reward_files": ["reward.txt", "reward.json"],
            "verify_as": config.verify_as,
            "verify_timeout_s": config.verifier.timeout_sec,
            "env": {**(main.environment if main is not None else {}), **config.environment.env},
            "network": config.network,
            "memory_mb": config.environment.effective_memory_mb,
            "disk_mb": config.environment.effective_storage_mb,
            "cpus": config.environment.cpus,
        }
        fields["artifacts"] = config.artifact_paths(fields["workdir"] or WORKDIR)
        if (skills := config.environment.skills_dir) is not None:
            fields["skills_dir"] = skills if skills.startswith("/") else f"{fields['workdir'] or WORKDIR}/{skills}"
        if config.environment.mcp_servers:
            fields["mcp_servers"] = [server.model_dump() for server in config.environment.mcp_servers]
        if config.agent.timeout_sec is not None:
            fields["agent_timeout_s"] = config.agent.timeout_sec
        if config.verifier.reward_range is not None:
            fields["reward_range"] = config.verifier.reward_range
        if config.verifier.reward_key is not None:
            fields["reward_key"] = config.verifier.reward_key
        if config.verifier.tests is not None:
            fields |= self._graded_tests(config.verifier.tests)
            fields["env"] |= config.verifier.env
        elif config.verifier.env:
            fields["verify_files"][VERIFIER_ENV_FILE] = "".join(
                f"{name}={shlex.quote(value)}\n" for name, value in config.verifier.env.items()
            )
            fields["verify"] = [f"set -a && . {VERIFIER_ENV_FILE} && set +a && {VERIFY_COMMAND}"]
        fields["verify_sandbox"] = config.verifier.sandbox or ("fresh" if config.verifier.tests is not None else "same")
        if oracle:
            fields["files"] = {} if self.steps else self.solution_files()
            fields["solution"] = [] if self.steps else [SOLUTION_COMMAND]
            fields["solution_as"] = "root"
            fields["env"] = {**fields["env"], **config.solution.env}
        if self.steps:
            fields |= self._step_fields(oracle=oracle)
        return fields

    def _step_fields(self, *, oracle: bool) -> dict[str, Any]:
        """`[[steps]]`: each step's instruction, workdir/ files and setup.sh, tests (over the task's), verifier
        env and timeouts, min_reward; in an oracle run, its solution/. Verify runs in a fresh box for each."""
        steps = []
        for step, config in zip(self.steps, self.config.steps, strict=True):
            env = {**self.config.verifier.env, **config.verifier.env}
            verify_files = dict(step.verify_files)
            if env:
                verify_files[VERIFIER_ENV_FILE] = "".join(
                    f"{name}={shlex.quote(value)}\n" for name, value in env.items()
                )
            files = dict(step.workdir_files)
            solution: list[str] = []
            if oracle:
                files |= _read_tree(TaskDir(self.path), f"steps/{step.name}/solution", key_prefix="/solution")[0]
                solution = [SOLUTION_COMMAND]
            steps.append(
                {
                    "name": step.name,
                    "instruction": step.instruction,
                    "files": files,
                    "setup": [STEP_SETUP_COMMAND] if STEP_SETUP in step.workdir_files else [],
                    "verify": [f"set -a && . {VERIFIER_ENV_FILE} && set +a && {VERIFY_COMMAND}"] if env else None,
                    "verify_files": verify_files,
                    "solution": solution,
                    "agent_timeout_s": config.agent.timeout_sec,
                    "verify_timeout_s": config.verifier.timeout_sec,
                    "min_reward": config.min_reward,
                }
            )
        strategy = self.config.multi_step_reward_strategy or "mean"
        return {"steps": steps, "step_reward": strategy, "verify_sandbox": "fresh", "verify": [VERIFY_COMMAND]}

    def _graded_tests(self, tests: VerifierTests) -> dict[str, Any]:
        """`[verifier.tests]`: tests/ (but test.sh) handed to the product's test grader, which runs them in place of
        test.sh."""
        files = {
            path.removeprefix("/tests/"): text for path, text in self.verify_files.items() if path != "/tests/test.sh"
        }
        graded = {"files": files, **tests.model_dump(include=set(VerifierTests.model_fields))}
        return {"tests": graded, "verify": [], "verify_files": {}}


def request_from_task_dir(
    path: Path,
    *,
    oracle: bool = False,
    builder: ImageBuilder | None = None,
    progress: BuildProgress | None = None,
    warn: Callable[[str], None] | None = None,
    **overrides: Any,
) -> RolloutRequest:
    """The rollout request of the Harbor task at `path`, its image taken from local container storage or built (what
    the build does to `progress`, with the builder made here); what of the task is carried with a deviation goes to
    `warn` (default: the log), a line each. An agent run of a task with a stdio MCP server is refused before any
    build (STDIO_REFUSED)."""
    task = HarborTask.from_dir(path)
    for note in task.unsupported:
        (warn or log.warning)(f"{path / 'task.toml'}: {note}")
    if oracle:
        task.require_solution()
    elif stdio := [server.name for server in task.config.environment.mcp_servers if server.transport == "stdio"]:
        raise TaskFormatError(f"{path / 'task.toml'}: mcp_servers.{stdio[0]}: {STDIO_REFUSED}")
    builder = builder or ImageBuilder.for_settings(Settings.load(), progress=progress)
    image, workdir = task_image(task, builder)
    services: list[Service] = []
    if task.compose is not None:
        timeout_s = task.config.environment.build_timeout_sec
        environment = task.path / "environment"
        services = sidecar_services(task.compose, environment, builder, task_id=task.task_id, timeout_s=timeout_s)
    entrypoint, user = builder.image_entrypoint(image), builder.image_user(image)
    return task.to_request(
        image, workdir, oracle=oracle, entrypoint=entrypoint, services=services, user=user, **overrides
    )


def entrypoint_command(entrypoint: Sequence[str], *, user: str = "") -> str:
    """The image's ENTRYPOINT as Harbor's container runs it (with `sleep infinity` as its command, as the sandbox's
    root, or the image's USER `user`), started in the background so the services it starts outlive setup; setup
    waits, a bounded while, until it has exec'd its command (its start-up is done), and fails, with its output, if
    it exits with an error."""
    started = shlex.join([*entrypoint, "sleep", "infinity"])
    if user:
        started = shlex.join(["/bin/sh", "-c", as_image_user(user, started)])
    return (
        f"{started} > {ENTRYPOINT_LOG} 2>&1 < /dev/null &\n"
        "pid=$!\n"
        f"for _ in $(seq {ENTRYPOINT_START_S * 10}); do\n"
        '  if ! kill -0 "$pid" 2>/dev/null; then\n'
        '    wait "$pid"; status=$?\n'
        '    [ "$status" = 0 ] && exit 0\n'
        f'    echo "the image\'s ENTRYPOINT exited $status: $(tail -c 600 {ENTRYPOINT_LOG})" >&2; exit 1\n'
        "  fi\n"
        '  [ "$(cat /proc/$pid/comm 2>/dev/null)" = sleep ] && exit 0\n'
        "  sleep 0.1\n"
        "done\n"
    )


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


def _read_instruction(task_dir: TaskDir, relative: str = "instruction.md") -> str:
    path = task_dir.path / relative
    if task_dir.kind(relative) != "file":
        raise TaskFormatError(f"{path}: missing (the agent's instruction)")
    instruction = _read_text(task_dir, relative, 4 * MAX_INSTRUCTION_CHARS)
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


def _read_steps(task_dir: TaskDir, config: TaskConfig) -> list[HarborStep]:
    """Each `[[steps]]` entry's directory steps/<name>/, read; a directory no entry declares is refused (a step the
    author meant to run would silently not run)."""
    if not config.steps:
        return []
    declared = {step.name for step in config.steps}
    present = (
        {relative.split("/")[1] for relative, kind in task_dir.walk("steps") if kind == "dir"}
        if (task_dir.kind("steps") == "dir")
        else set()
    )
    if stray := sorted(present - declared):
        raise TaskFormatError(f"{task_dir.path / 'steps'}: {', '.join(stray)}: not declared in task.toml's [[steps]]")
    steps = []
    for step in config.steps:
        root = f"steps/{step.name}"
        if task_dir.kind(root) != "dir":
            raise TaskFormatError(f"{task_dir.path / root}: missing (the directory of [[steps]] name = {step.name!r})")
        has = {sub: task_dir.kind(f"{root}/{sub}") == "dir" for sub in ("tests", "workdir")}
        steps.append(
            HarborStep(
                name=step.name,
                instruction=_read_instruction(task_dir, f"{root}/instruction.md"),
                verify_files=_read_tree(task_dir, f"{root}/tests", key_prefix="/tests")[0] if has["tests"] else {},
                workdir_files=_read_tree(task_dir, f"{root}/workdir", key_prefix="")[0] if has["workdir"] else {},
                has_solution=task_dir.kind(f"{root}/solution/solve.sh") == "file",
            )
        )
    return steps


def _read_tree(task_dir: TaskDir, name: str, *, key_prefix: str | None = None) -> tuple[dict[str, str], list[str]]:
    """Every file under the task's directory `name` as {/name/relative path: text} (`key_prefix`/relative path when
    given; '' keys them relative), and the keys of executables."""
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
        key = f"/{relative}" if key_prefix is None else _rekeyed(relative.removeprefix(f"{name}/"), key_prefix)
        files[key] = text
        if task_dir.is_executable(relative):
            executables.append(key)
    return files, executables


def _rekeyed(inside: str, key_prefix: str) -> str:
    return f"{key_prefix}/{inside}" if key_prefix else inside


def _environment_dockerfile(task_dir: TaskDir, docker_image: str | None) -> Path | None:
    """environment/Dockerfile, when there is one; environment/ is walked whole, so a link anywhere in the build
    context is refused here, before any build."""
    environment = task_dir.path / "environment"
    if task_dir.kind("environment") == "dir":
        collections.deque(task_dir.walk("environment"), maxlen=0)
        if task_dir.kind("environment/Dockerfile") == "file":
            return environment / "Dockerfile"
    if docker_image:
        return None
    raise TaskFormatError(f"{environment / 'Dockerfile'}: missing, and task.toml sets no [environment] docker_image")


def _read_compose(task_dir: TaskDir) -> ComposeFile | None:
    """environment/'s compose file, parsed; the main service is the rollout's sandbox (environment/Dockerfile)."""
    names = [name for name in COMPOSE_FILES if task_dir.kind(f"environment/{name}") == "file"]
    if not names:
        return None
    if len(names) > 1:
        raise TaskFormatError(f"{task_dir.path / 'environment'}: {' and '.join(names)}: one compose file, not two")
    path = task_dir.path / "environment" / names[0]
    try:
        compose = parse_compose(_read_text(task_dir, f"environment/{names[0]}", MAX_COMPOSE_TEXT))
    except ComposeError as error:
        raise TaskFormatError(f"{path}: {error}") from None
    if compose.main is not None and compose.main.build not in (None, "."):
        raise TaskFormatError(f"{path}: services.main.build: the main service is environment/ itself (Harbor's)")
    return compose.model_copy(update={"noted": [f"environment/{names[0]}: {note}" for note in compose.noted]})


def _executable_notes(executables: list[str], *, keep: set[str]) -> list[str]:
    return [
        f"{key}: the executable bit is not kept (protected files are written as text; run it with its interpreter)"
        for key in executables
        if key not in keep
    ]
