"""The reward: reward.json (its `reward` key) wins over reward.txt, which wins over the verify pass rate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from opencode_env.sandbox.base import REWARD_JSON, REWARD_TXT, Sandbox
from opencode_env.wire import CommandResult, RewardSource
from opencode_env.wire.bounded_parse import REWARD_JSON as REWARD_JSON_LIMITS
from opencode_env.wire.bounded_parse import loads_json


@dataclass(frozen=True)
class Reward:
    value: float | None
    source: RewardSource
    problem: str | None = None


def parse_reward_json(raw: bytes) -> float:
    data = loads_json(raw.decode("utf-8"), where="reward.json", limits=REWARD_JSON_LIMITS)
    if not isinstance(data, dict) or "reward" not in data:
        raise ValueError("reward.json must be an object with a 'reward' key")
    return _finite(data["reward"])


def parse_reward_txt(raw: bytes) -> float:
    return _finite(raw.decode("utf-8").strip())


def _finite(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"reward must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"reward must be finite, got {value!r}")
    return number


def pass_rate(results: Sequence[CommandResult]) -> float | None:
    if not results:
        return None
    return sum(1 for result in results if result.exit_code == 0) / len(results)


async def read_reward(sandbox: Sandbox, verify_results: Sequence[CommandResult]) -> Reward:
    problems: list[str] = []
    for path, parse, source in (
        (REWARD_JSON, parse_reward_json, "reward_json"),
        (REWARD_TXT, parse_reward_txt, "reward_txt"),
    ):
        try:
            raw = await sandbox.read_file(path)
        except FileNotFoundError:
            continue
        try:
            return Reward(parse(raw), source)  # type: ignore[arg-type]
        except (ValueError, UnicodeDecodeError) as error:
            problems.append(f"{path}: {error}")
    problem = "; ".join(problems) or None
    rate = pass_rate(verify_results)
    if rate is None:
        return Reward(None, "none", problem)
    return Reward(rate, "verify_pass_rate", problem)
