"""A Harbor task's `environment/docker-compose.yaml` read into a typed model (pure: text in, model or ComposeError
out). Any text either parses or is refused with the field it failed at; never another exception.

What runs here: the `main` service is the rollout's own sandbox (environment/Dockerfile, as Harbor builds it); each
other service is a sidecar (wire/services.py). Supported per service: build (its context inside environment/, its
Dockerfile named Dockerfile), image, command, entrypoint, environment, working_dir, depends_on, healthcheck,
mem_limit, ports/expose (just ports: every service shares one loopback), hostname/container_name (more names),
and keys without effect here (restart, init, tty, stdin_open, labels, networks). The rest is refused by name:
volumes (nothing of the host inside, no shared file system), host privileges and namespaces, env_file, ...
`${NAME}` reads the host's environment in compose, which a task never sees: only `${NAME:-default}`, `${NAME-default}`
and `$$` are taken.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opencode_env.tasks.task_files import TaskFormatError
from opencode_env.wire.services import MAIN_SERVICE, Condition, Dependency, HealthCheck

MAX_COMPOSE_BYTES = 256 * 1024
MAX_ALIASES = 64
MAX_DEPTH = 32
DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(h|ms|m|s|us|ns))+$")
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)")
UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
MEMORY = re.compile(r"^(\d{1,15})\s*([bkmg]?)b?$", re.IGNORECASE)
MAX_MEMORY_MB = 65_536
MEMORY_MB = {"": 1 / 2**20, "b": 1 / 2**20, "k": 1 / 1024, "m": 1.0, "g": 1024.0}
VARIABLE = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
TOP_LEVEL = frozenset({"services", "version", "name", "networks"})
WITHOUT_EFFECT = {
    "restart": "taken without effect: a service that exits is not restarted",
    "init": "taken without effect",
    "tty": "taken without effect",
    "stdin_open": "taken without effect",
    "labels": "taken without effect",
    "platform": "taken without effect: the image runs on this machine's platform",
    "networks": "taken without effect: every service shares the rollout's one network",
    "ports": "just ports: every service shares one loopback (nothing is published on the host)",
    "expose": "just ports: every service shares one loopback",
}
REFUSED = {
    "volumes": "nothing of the host goes into a sandbox, and services share no file system (COPY files in the "
    "service's Dockerfile)",
    "env_file": "not supported: give the values in `environment`",
    "privileged": "host privileges are refused",
    "cap_add": "host privileges are refused",
    "devices": "host devices are refused",
    "security_opt": "host privileges are refused",
    "sysctls": "not supported",
    "network_mode": "every service shares the rollout's network; no other mode is given",
    "pid": "the host's namespaces are refused",
    "ipc": "the host's namespaces are refused",
    "userns_mode": "the host's namespaces are refused",
    "cgroup_parent": "the host's cgroups are refused",
    "extra_hosts": "every service name is 127.0.0.1 already; no other host is reachable",
    "dns": "the sandbox's network has no resolver of its own",
    "secrets": "not supported",
    "configs": "not supported",
    "extends": "not supported: write the service out",
    "profiles": "not supported: every service runs",
    "deploy": "not supported: one instance of each service runs",
    "scale": "not supported: one instance of each service runs",
    "links": "not needed: every service name is 127.0.0.1",
}
SERVICE_KEYS = frozenset(
    {
        "build", "image", "command", "entrypoint", "environment", "working_dir", "depends_on", "healthcheck",
        "mem_limit", "hostname", "container_name", "user", *WITHOUT_EFFECT,
    }
)  # fmt: skip
HEALTH_KEYS = frozenset({"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"})
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class ComposeError(TaskFormatError):
    """A compose file we cannot run; the message starts with the field (services.db.volumes: ...)."""


class ComposeService(BaseModel):
    """One service as the file declares it; `build` is its context relative to environment/ ('.' for itself)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    build: str | None = None
    image: str | None = None
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    working_dir: str = ""
    depends_on: list[Dependency] = Field(default_factory=list)
    healthcheck: HealthCheck | None = None
    aliases: list[str] = Field(default_factory=list)
    memory_mb: int | None = None


class ComposeFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    main: ComposeService | None
    sidecars: list[ComposeService]
    noted: list[str] = Field(default_factory=list, description="Keys taken without effect here, by field.")


def parse_compose(text: str) -> ComposeFile:
    """The compose file `text` as a typed model; ComposeError, naming the field, for anything we cannot run."""
    if len(text.encode("utf-8", errors="replace")) > MAX_COMPOSE_BYTES:
        raise ComposeError(f"the compose file is over {MAX_COMPOSE_BYTES} bytes")
    document = _load(text)
    if not isinstance(document, dict):
        raise ComposeError(f"top level: a mapping with `services` expected, got {_kind(document)}")
    noted: list[str] = []
    for key in document:
        if not isinstance(key, str):
            raise ComposeError(f"top level: {key!r} is not a key name")
        if key == "volumes":
            raise ComposeError(f"volumes: {REFUSED['volumes']}")
        if key not in TOP_LEVEL and not key.startswith("x-"):
            raise ComposeError(f"top level: {key[:80]!r}: unknown or unsupported key")
    if "networks" in document:
        noted.append("networks: every service shares the rollout's one network")
    services = document.get("services")
    if not isinstance(services, dict) or not services:
        raise ComposeError(f"services: a mapping of at least one service expected, got {_kind(services)}")
    parsed = [_service(name, body, noted) for name, body in services.items()]
    main = next((service for service in parsed if service.name == MAIN_SERVICE), None)
    return ComposeFile(main=main, sidecars=[s for s in parsed if s.name != MAIN_SERVICE], noted=noted)


def _load(text: str) -> Any:
    """YAML within limits: aliases and nesting counted on the event stream before anything is built."""
    try:
        aliases, depth = 0, 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise ComposeError(f"the compose file uses more than {MAX_ALIASES} YAML aliases")
            elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ComposeError(f"the compose file nests deeper than {MAX_DEPTH} levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as error:
        if isinstance(error, ComposeError):
            raise
        raise ComposeError(f"the compose file is not YAML we can read: {str(error)[:300]}") from None


def _service(name: Any, body: Any, noted: list[str]) -> ComposeService:
    if not isinstance(name, str) or not NAME.match(name):
        raise ComposeError(
            f"services: {str(name)[:80]!r} is not a service name we take (a-z, 0-9, '_-', 63 at most: one label, "
            "never a domain)"
        )
    where = f"services.{name}"
    if not isinstance(body, dict):
        raise ComposeError(f"{where}: a mapping expected, got {_kind(body)}")
    for key in body:
        if not isinstance(key, str):
            raise ComposeError(f"{where}: {str(key)[:80]!r} is not a key name")
        if key in REFUSED:
            raise ComposeError(f"{where}.{key}: {REFUSED[key]}")
        if key not in SERVICE_KEYS:
            raise ComposeError(f"{where}.{key}: unknown or unsupported key")
        if key in WITHOUT_EFFECT:
            noted.append(f"{where}.{key}: {WITHOUT_EFFECT[key]}")
    if (user := body.get("user")) is not None and str(user).split(":")[0] not in ("root", "0"):
        raise ComposeError(f"{where}.user: {str(user)[:40]!r}: a service runs as its sandbox's root")
    fields: dict[str, Any] = {
        "name": name,
        "build": _build(body.get("build"), f"{where}.build"),
        "image": _optional_string(body.get("image"), f"{where}.image"),
        "command": _words(body.get("command"), f"{where}.command"),
        "entrypoint": _words(body.get("entrypoint"), f"{where}.entrypoint"),
        "environment": _environment(body.get("environment"), f"{where}.environment"),
        "working_dir": _optional_string(body.get("working_dir"), f"{where}.working_dir") or "",
        "depends_on": _depends_on(body.get("depends_on"), f"{where}.depends_on"),
        "healthcheck": _healthcheck(body.get("healthcheck"), f"{where}.healthcheck"),
        "aliases": [
            alias
            for key in ("hostname", "container_name")
            if (alias := _optional_string(body.get(key), f"{where}.{key}")) is not None
        ],
        "memory_mb": _memory_mb(body.get("mem_limit"), f"{where}.mem_limit"),
    }
    for alias in fields["aliases"]:
        if not NAME.match(alias):
            raise ComposeError(
                f"{where}: the name {alias[:80]!r} is not one we take (a-z, 0-9, '_-': one label, never a domain)"
            )
    if fields["build"] is None and fields["image"] is None and name != MAIN_SERVICE:
        raise ComposeError(f"{where}: neither build nor image: nothing to run")
    try:
        return ComposeService.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        raise ComposeError(f"{where}.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _string(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ComposeError(f"{where}: a string expected, got {_kind(value)}")
    return _interpolated(str(value), where)


def _optional_string(value: Any, where: str) -> str | None:
    return None if value is None else _string(value, where)


def _interpolated(text: str, where: str) -> str:
    """compose's `$` substitution without the host's environment: defaults and `$$` only."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group(2) is not None:
            return match.group(2)
        variable = match.group(1) or match.group(3)
        raise ComposeError(
            f"{where}: ${{{variable}}} reads the host's environment, which a task never sees (write the value, or "
            f"${{{variable}:-default}})"
        )

    if "\x00" in text:
        raise ComposeError(f"{where}: a NUL character")
    return VARIABLE.sub(substitute, text)


def _words(value: Any, where: str) -> list[str] | None:
    """command/entrypoint: a list as it is, a string split as a shell would split its words (compose's rule)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [_string(word, f"{where}[{index}]") for index, word in enumerate(value)]
    text = _string(value, where)
    try:
        return shlex.split(text)
    except ValueError as error:
        raise ComposeError(f"{where}: {error}") from None


def _build(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        for key in value:
            if key not in ("context", "dockerfile"):
                raise ComposeError(f"{where}.{key}: unsupported (a context and its Dockerfile only)")
        dockerfile = _optional_string(value.get("dockerfile"), f"{where}.dockerfile")
        if dockerfile not in (None, "Dockerfile"):
            raise ComposeError(f"{where}.dockerfile: {dockerfile[:80]!r}: the context's own Dockerfile only")
        value = value.get("context", ".")
    context = _string(value, f"{where}.context" if "." in where else where).strip()
    parts = [part for part in context.split("/") if part not in ("", ".")]
    if context.startswith("/") or ".." in parts or "://" in context:
        raise ComposeError(f"{where}: {context[:80]!r}: a context inside environment/ only (nothing of the host)")
    return "/".join(parts) or "."


def _environment(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    pairs: list[tuple[str, str | None]] = []
    if isinstance(value, dict):
        for name, given in value.items():
            if not isinstance(name, str):
                raise ComposeError(f"{where}: {str(name)[:80]!r} is not a variable name")
            pairs.append((name, None if given is None else _string(given, f"{where}.{name}")))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            entry = _string(item, f"{where}[{index}]")
            name, equals, given = entry.partition("=")
            pairs.append((name, given if equals else None))
    else:
        raise ComposeError(f"{where}: a mapping or a list of NAME=value expected, got {_kind(value)}")
    environment: dict[str, str] = {}
    for name, given in pairs:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", name):
            raise ComposeError(f"{where}: {name[:80]!r} is not a variable name")
        if given is None:
            raise ComposeError(f"{where}.{name}: no value (compose would take the host's): write the value")
        environment[name] = given
    return environment


def _depends_on(value: Any, where: str) -> list[Dependency]:
    if value is None:
        return []
    if isinstance(value, list):
        return [Dependency(service=_name(item, where), condition="service_started") for item in value]
    if not isinstance(value, dict):
        raise ComposeError(f"{where}: a list or a mapping of services expected, got {_kind(value)}")
    dependencies = []
    for target, options in value.items():
        name = _name(target, where)
        condition: Any = "service_started"
        if options is not None:
            if not isinstance(options, dict):
                raise ComposeError(f"{where}.{name}: a mapping expected, got {_kind(options)}")
            for key in options:
                if key not in ("condition", "required", "restart"):
                    raise ComposeError(f"{where}.{name}.{key}: unknown or unsupported key")
            condition = options.get("condition", condition)
        if condition not in get_args(Condition):
            raise ComposeError(f"{where}.{name}.condition: {str(condition)[:80]!r} is none of {get_args(Condition)}")
        dependencies.append(Dependency(service=name, condition=condition))
    return dependencies


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise ComposeError(f"{where}: {str(value)[:80]!r} is not a service name")
    return value


def _healthcheck(value: Any, where: str) -> HealthCheck | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ComposeError(f"{where}: a mapping expected, got {_kind(value)}")
    for key in value:
        if key not in HEALTH_KEYS:
            raise ComposeError(f"{where}.{key}: unknown or unsupported key")
    if value.get("disable") is True:
        return None
    test = _health_test(value.get("test"), f"{where}.test")
    if test is None:
        return None
    fields: dict[str, Any] = {"test": test}
    for key, field in (("interval", "interval_s"), ("timeout", "timeout_s"), ("start_period", "start_period_s")):
        if value.get(key) is not None:
            fields[field] = _duration_s(value[key], f"{where}.{key}")
    if (retries := value.get("retries")) is not None:
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise ComposeError(f"{where}.retries: a whole number expected, got {_kind(retries)}")
        fields["retries"] = retries
    try:
        return HealthCheck.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        raise ComposeError(f"{where}.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def _health_test(value: Any, where: str) -> list[str] | None:
    """Docker's forms: ["CMD", argv...], ["CMD-SHELL", "text"], "text" (a shell's), ["NONE"] (no check)."""
    if isinstance(value, str):
        return ["/bin/sh", "-c", _interpolated(value, where)]
    if not isinstance(value, list) or not value:
        raise ComposeError(f"{where}: a string or a non-empty list expected, got {_kind(value)}")
    words = [_string(word, f"{where}[{index}]") for index, word in enumerate(value)]
    head, rest = words[0], words[1:]
    if head == "NONE":
        return None
    if head == "CMD" and rest:
        return rest
    if head == "CMD-SHELL" and len(rest) == 1:
        return ["/bin/sh", "-c", rest[0]]
    raise ComposeError(f"{where}: starts with CMD (then argv), CMD-SHELL (then one command) or NONE")


def _duration_s(value: Any, where: str) -> float:
    text = _string(value, where).strip()
    if not DURATION.match(text):
        raise ComposeError(f"{where}: {text[:40]!r} is not a duration (like 5s, 1m30s, 500ms)")
    seconds = sum(float(number) * UNIT_S[unit] for number, unit in DURATION_PART.findall(text))
    if not math.isfinite(seconds):
        raise ComposeError(f"{where}: {text[:40]!r} is too long")
    return seconds


def _memory_mb(value: Any, where: str) -> int | None:
    if value is None:
        return None
    match = MEMORY.match(_string(value, where).strip())
    if match is None:
        raise ComposeError(f"{where}: {str(value)[:40]!r} is not a size (like 512m, 1g)")
    memory_mb = max(1, math.ceil(int(match.group(1)) * MEMORY_MB[match.group(2).lower()]))
    if not 64 <= memory_mb <= MAX_MEMORY_MB:
        raise ComposeError(f"{where}: {memory_mb} MiB: a service has 64 to {MAX_MEMORY_MB} MiB")
    return memory_mb
