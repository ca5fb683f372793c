"""The reward: the reward file the task declares (`RolloutRequest.declared_reward_files`: reward.json's `reward` key,
reward.txt's number), else the verify pass rate. A file the task does not declare is never read: code under test runs
as the grader, which can write the verifier directory. Both declared and both written is a conflict only a writer
other than the task's script makes (a script writes one): graded 0."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opencode_env.sandbox.base import REWARD_JSON, REWARD_TXT, Sandbox
from opencode_env.wire import CommandResult, RewardSource
from opencode_env.wire.bounded_parse import REWARD_JSON as REWARD_JSON_LIMITS
from opencode_env.wire.bounded_parse import loads_json
from opencode_env.wire.request import RewardFile


@dataclass(frozen=True)
class Reward:
    value: float | None
    source: RewardSource
    problem: str | None = None
    conflict: tuple[str, ...] = ()
    """The reward files written when only one may be (graded 0)."""


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


READERS: dict[RewardFile, tuple[str, Callable[[bytes], float], RewardSource]] = {
    "reward.json": (REWARD_JSON, parse_reward_json, "reward_json"),
    "reward.txt": (REWARD_TXT, parse_reward_txt, "reward_txt"),
}


async def read_reward(
    sandbox: Sandbox, verify_results: Sequence[CommandResult], declared: Sequence[RewardFile]
) -> Reward:
    written: list[tuple[str, bytes, Callable[[bytes], float], RewardSource]] = []
    for name in declared:
        path, parse, source = READERS[name]
        try:
            written.append((path, await sandbox.read_file(path), parse, source))
        except FileNotFoundError:
            continue
    if len(written) > 1:
        paths = tuple(path for path, *_ in written)
        return Reward(0.0, written[0][3], f"{' and '.join(paths)} both written", conflict=paths)
    problems: list[str] = []
    for path, raw, parse, source in written:
        try:
            return Reward(parse(raw), source)
        except (ValueError, UnicodeDecodeError) as error:
            problems.append(f"{path}: {error}")
    problem = "; ".join(problems) or None
    rate = pass_rate(verify_results)
    if rate is None:
        return Reward(None, "none", problem)
    return Reward(rate, "verify_pass_rate", problem)
