"""A rollout's resource limits: the request's own values, checked against the server's maxima."""

from __future__ import annotations

from opencode_env.sandbox.base import ResourceLimits
from opencode_env.settings import Settings, variable
from opencode_env.wire import RolloutRequest

SERVER_MAXIMA = {
    "memory_mb": "max_memory_mb",
    "max_processes": "max_processes",
    "disk_mb": "max_disk_mb",
    "cpus": "max_cpus",
}
"""Each request field and the setting that bounds it."""


class LimitError(ValueError):
    """A requested limit is above what this server allows; the message names the field and the maximum."""


def sandbox_limits(request: RolloutRequest, settings: Settings) -> ResourceLimits:
    for field, setting in SERVER_MAXIMA.items():
        maximum = float(getattr(settings, setting))
        value = getattr(request, field)
        if value > maximum:
            raise LimitError(
                f"{field}={value} is over this server's maximum of {maximum:g} (set by {variable(setting)})"
            )
    return ResourceLimits(
        memory_mb=request.memory_mb, max_processes=request.max_processes, disk_mb=request.disk_mb, cpus=request.cpus
    )
