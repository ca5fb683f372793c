"""A rollout's resource limits: the request's own values, checked against the server's maxima."""

from __future__ import annotations

import os
from collections.abc import Mapping

from opencode_env.sandbox.base import ResourceLimits
from opencode_env.wire.models import RolloutRequest

SERVER_MAXIMA = {
    "memory_mb": ("OPENCODE_ENV_MAX_MEMORY_MB", 16384),
    "max_processes": ("OPENCODE_ENV_MAX_PROCESSES", 4096),
    "disk_mb": ("OPENCODE_ENV_MAX_DISK_MB", 32768),
    "cpus": ("OPENCODE_ENV_MAX_CPUS", 8),
}


class LimitError(ValueError):
    """A requested limit is above what this server allows; the message names the field and the maximum."""


def sandbox_limits(request: RolloutRequest, environ: Mapping[str, str] | None = None) -> ResourceLimits:
    env = os.environ if environ is None else environ
    for field, (variable, default) in SERVER_MAXIMA.items():
        maximum = float(env.get(variable, default))
        value = getattr(request, field)
        if value > maximum:
            raise LimitError(f"{field}={value} is over this server's maximum of {maximum:g} (set by {variable})")
    return ResourceLimits(
        memory_mb=request.memory_mb, max_processes=request.max_processes, disk_mb=request.disk_mb, cpus=request.cpus
    )
