"""A rollout's sidecar services (a docker-compose environment's other containers): each runs in a sandbox of its
own, beside the rollout's, sharing its network as a pod does, so a service's name is 127.0.0.1 and its ports are
just ports. The pure checks here (names, what depends on what, the order they start in) are the wire's; how a
service runs is the backend's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_SERVICES = 8
MAIN_SERVICE = "main"
"""The rollout's own sandbox in compose's terms (Harbor's name for the agent's container)."""
HEALTH_WAIT_S = 120.0
"""The longest a healthcheck is waited for, whatever its interval, retries and start period say."""

ServiceName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
"""One label, no dot: a service's name is 127.0.0.1 in the task's /etc/hosts, and never shadows a domain (a package
index, the model's host) for the task's tools."""
Condition = Literal["service_started", "service_healthy", "service_completed_successfully"]
Word = Annotated[str, StringConstraints(max_length=16_000, pattern=r"^[^\x00]*$")]


class HealthCheck(BaseModel):
    """compose's `healthcheck`: `test` run in the service's sandbox until it exits 0, as Docker runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    test: list[Word] = Field(min_length=1, max_length=256, description="argv of the check.")
    interval_s: float = Field(30.0, gt=0, le=3600)
    timeout_s: float = Field(30.0, gt=0, le=3600)
    retries: int = Field(3, ge=1, le=1000)
    start_period_s: float = Field(0.0, ge=0, le=3600)

    def wait_s(self) -> float:
        """How long a dependant waits for it to pass, at most HEALTH_WAIT_S."""
        return min(HEALTH_WAIT_S, self.start_period_s + self.retries * (self.interval_s + self.timeout_s))

    def unhealthy_after_s(self) -> float:
        """When failing checks make it unhealthy: Docker's earliest verdict, the start period then `retries` failed
        checks an interval apart (checks may run more often; failing ones cannot end it sooner)."""
        return min(self.wait_s(), self.start_period_s + self.retries * self.interval_s)


class Dependency(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    service: ServiceName
    condition: Condition = "service_started"


class Service(BaseModel):
    """One sidecar: its image (from this machine's storage), the argv it runs (compose's entrypoint and command,
    resolved against the image's), as the sandbox's root, in `workdir` with `env`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ServiceName
    image: Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^[A-Za-z0-9._:@/+-]+$")]
    command: list[Word] = Field(min_length=1, max_length=256)
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")], Word] = Field(
        default_factory=dict, max_length=64
    )
    workdir: Annotated[str, StringConstraints(max_length=512, pattern=r"^(/[A-Za-z0-9._@+-]+)*/?$")] = ""
    depends_on: list[Dependency] = Field(default_factory=list, max_length=MAX_SERVICES)
    healthcheck: HealthCheck | None = None
    awaited: Condition | None = Field(
        None, description="What the rollout's own sandbox waits for before setup (compose's main depends_on)."
    )
    aliases: list[ServiceName] = Field(default_factory=list, max_length=4, description="More names for 127.0.0.1.")
    memory_mb: int = Field(512, ge=64, le=65_536, description="Memory for everything the service runs (MiB).")
    max_processes: int = Field(256, ge=16, le=100_000)
    disk_mb: int = Field(1024, ge=64, le=65_536, description="Its writable tree (MiB).")


SERVICE_START_S = 60.0
"""A service's sandbox and its start, beyond its healthcheck's wait: part of a rollout's derived budget."""


def services_budget_s(services: Sequence[Service]) -> float:
    """What starting `services` may add to a rollout's deadline."""
    return sum(SERVICE_START_S + (s.healthcheck.wait_s() if s.healthcheck else 0.0) for s in services)


def service_problems(services: Sequence[Service]) -> list[str]:
    """What makes a set of services unrunnable: a name twice (or `main`), a dependency on no service, a
    `service_healthy` one on a service without a healthcheck, a cycle."""
    problems: list[str] = []
    names = [service.name for service in services]
    for name in sorted({name for name in names if names.count(name) > 1}):
        problems.append(f"services: {name!r} twice")
    if MAIN_SERVICE in names:
        problems.append(f"services: {MAIN_SERVICE!r} is the rollout's own sandbox, not a sidecar")
    known = {service.name: service for service in services}
    for service in services:
        for dependency in service.depends_on:
            target = known.get(dependency.service)
            if target is None:
                problems.append(f"services.{service.name}.depends_on: {dependency.service!r} is no sidecar")
            elif dependency.condition == "service_healthy" and target.healthcheck is None:
                problems.append(
                    f"services.{service.name}.depends_on.{dependency.service}: service_healthy, but "
                    f"{dependency.service!r} has no healthcheck"
                )
    for service in services:
        if service.awaited == "service_healthy" and service.healthcheck is None:
            problems.append(f"services.{service.name}: the rollout waits for it healthy, but it has no healthcheck")
    if not problems and (cycle := _cycle(services)):
        problems.append(f"services: depends_on goes round: {' -> '.join(cycle)}")
    return problems


def start_order(services: Sequence[Service]) -> list[Service]:
    """Every service after those it depends on (ties in their declared order); the services must have no problem."""
    done: list[Service] = []
    started: set[str] = set()
    while len(done) < len(services):
        ready = [
            service
            for service in services
            if service.name not in started and all(d.service in started for d in service.depends_on)
        ]
        if not ready:
            raise ValueError("services: depends_on goes round")
        done.append(ready[0])
        started.add(ready[0].name)
    return done


def hosts_names(services: Sequence[Service]) -> list[str]:
    """The names a rollout with these services resolves to 127.0.0.1: `main`, each service and its aliases."""
    if not services:
        return []
    return [MAIN_SERVICE, *(name for service in services for name in (service.name, *service.aliases))]


def _cycle(services: Sequence[Service]) -> list[str]:
    edges = {service.name: [d.service for d in service.depends_on] for service in services}
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> list[str]:
        if state.get(name) == "open":
            return [*path[path.index(name) :], name]
        if state.get(name) == "done":
            return []
        state[name] = "open"
        for target in edges.get(name, []):
            if found := visit(target, [*path, name]):
                return found
        state[name] = "done"
        return []

    for name in edges:
        if found := visit(name, []):
            return found
    return []
