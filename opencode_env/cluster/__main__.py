"""`python -m opencode_env.cluster resources`: the `--resources` value for `ray start` on this node, from its memory
budget (OPENCODE_ENV_MEMORY_OVERCOMMIT) and CPUs; `... capacity` prints how that number was reached; `... flags`
prints the flags that turn off what rollouts never use (node.py's LEAN_RAY_START_FLAGS).
It needs no running Ray, so it runs before `ray start`."""

from __future__ import annotations

import sys

from opencode_env.cluster.capacity import node_capacity, ray_resources_json
from opencode_env.cluster.node import LEAN_RAY_START_FLAGS
from opencode_env.settings import Settings

USAGE = "usage: python -m opencode_env.cluster resources | capacity | flags"


def main(argv: list[str]) -> int:
    if argv == ["flags"]:
        print(" ".join(LEAN_RAY_START_FLAGS))
        return 0
    if argv not in (["resources"], ["capacity"]):
        print(USAGE, file=sys.stderr)
        return 2
    capacity = node_capacity(Settings.load().memory_overcommit)
    print(ray_resources_json(capacity) if argv == ["resources"] else capacity.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
