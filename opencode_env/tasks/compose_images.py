"""A compose environment's sidecars as the rollout's `services`: each built from its `build:` context (inside
environment/, offline, as the main image is) or taken from this machine's storage by its `image:` (never pulled),
its command resolved as Docker resolves it against the image's ENTRYPOINT and CMD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opencode_env.sandbox.local.services import ImageBuilder, ImageBuildError
from opencode_env.tasks.compose import ComposeFile, ComposeService
from opencode_env.tasks.task_files import TaskFormatError
from opencode_env.wire.services import Condition, Service


def sidecar_services(
    compose: ComposeFile, environment: Path, builder: ImageBuilder, *, task_id: str, timeout_s: float
) -> list[Service]:
    """The sidecars of `compose`, their images built or found; ImageBuildError or TaskFormatError names the service
    and the field."""
    awaited: dict[str, Condition] = {}
    if compose.main is not None:
        awaited = {dependency.service: dependency.condition for dependency in compose.main.depends_on}
    return [
        _service(sidecar, environment, builder, task_id=task_id, timeout_s=timeout_s, awaited=awaited.get(sidecar.name))
        for sidecar in compose.sidecars
    ]


def _service(
    sidecar: ComposeService,
    environment: Path,
    builder: ImageBuilder,
    *,
    task_id: str,
    timeout_s: float,
    awaited: Condition | None,
) -> Service:
    where = f"services.{sidecar.name}"
    if sidecar.build is not None:
        context = environment if sidecar.build == "." else environment / sidecar.build
        ref = builder.build(context, name=f"{task_id}-{sidecar.name}", timeout_s=timeout_s).ref
    else:
        assert sidecar.image is not None
        if not builder.image_exists(sidecar.image):
            raise ImageBuildError(
                f"{where}.image: {sidecar.image!r} is not in this machine's container storage and images are never "
                f"pulled: give the service a `build:` context in environment/, or `podman pull {sidecar.image}` first"
            )
        ref = sidecar.image
    entrypoint = sidecar.entrypoint if sidecar.entrypoint is not None else builder.image_entrypoint(ref)
    command = sidecar.command
    if command is None:
        command = builder.image_command(ref) if sidecar.entrypoint is None else []
    if not entrypoint + command:
        raise TaskFormatError(f"{where}: nothing to run (no command or entrypoint here, no CMD or ENTRYPOINT in {ref})")
    fields: dict[str, Any] = {
        "name": sidecar.name,
        "image": ref,
        "command": entrypoint + command,
        "env": sidecar.environment,
        "workdir": sidecar.working_dir or builder.image_workdir(ref),
        "depends_on": sidecar.depends_on,
        "healthcheck": sidecar.healthcheck,
        "aliases": sidecar.aliases,
        "awaited": awaited,
    }
    if sidecar.memory_mb is not None:
        fields["memory_mb"] = sidecar.memory_mb
    try:
        return Service.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        raise TaskFormatError(f"{where}.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
