"""The reward: the reward file the task declares (`RolloutRequest.declared_reward_files`), else the verify pass rate.

Provenance by construction: before verify the host makes the verifier directory the sandbox root's, sticky and open
to all (a test run may add files: a CTRF or JUnit report, logs), and each reward file in it an empty regular file of
the root's that every identity may write but none other than the root may remove, rename or replace (the sticky bit).
So a declared file is always there; the host reads it without following a link, and a file that is not the regular
one it made (a link, a directory, gone: only a root grader can do that) is forged. A file counts only when every
verify command ended by itself (not killed, not timed out: a writer cut short did not have its last word), it holds
a number by the strict grammar below, and the number lies in the task's `reward_range`. Anything else is 0.0 with a
finding, never a fallback to the exit statuses and never None. A file the task does not declare is never read.

Every parse here is total: any bytes give a value or a named problem, never an exception.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from opencode_env.sandbox.base import REWARD_JSON, REWARD_TXT, Sandbox
from opencode_env.wire import CommandResult, RewardSource
from opencode_env.wire.bounded_parse import REWARD_JSON as REWARD_JSON_LIMITS
from opencode_env.wire.bounded_parse import loads_json
from opencode_env.wire.grading import FindingKind
from opencode_env.wire.request import RewardFile

NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
"""A reward as a script prints one (`1`, `0.5`, `1e-3`): ASCII digits only, no `nan`, `inf`, `_` or other digits."""
MAX_NUMBER_CHARS = 4096
MAX_METRICS = 100
MAX_METRIC_KEY = 128
WHITESPACE = b" \t\r\n"
SIGNAL_EXIT = 128
"""A shell reports a child killed by signal N as 128 + N: a verify command that ended so was killed."""


@dataclass(frozen=True)
class Reward:
    value: float | None
    source: RewardSource
    problem: str | None = None
    finding: FindingKind | None = None
    """Set when the reward is not the grader's own word (graded 0.0, a policy outcome)."""
    paths: tuple[str, ...] = ()
    """What the finding names: the reward files (or the killed command)."""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Parsed:
    value: float | None
    problem: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    names_reward: bool = True
    """reward.json has the key the reward is read from (False: a detail file, Harbor's reward.txt gives it)."""


def parse_number(text: str) -> float | None:
    """The number the strict grammar reads in `text` (ASCII whitespace around it allowed), else None. Never raises:
    float() of a grammar match cannot fail (a huge one is inf, which the range refuses)."""
    stripped = text.strip(" \t\r\n")
    if len(stripped) > MAX_NUMBER_CHARS or not NUMBER.fullmatch(stripped):
        return None
    return float(stripped)


def parse_reward_txt(raw: bytes) -> Parsed:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Parsed(None, "reward.txt is not UTF-8")
    value = parse_number(text)
    if value is None:
        return Parsed(None, f"reward.txt holds no number: {_shown(raw)}")
    return Parsed(value)


@dataclass(frozen=True)
class _JsonNumber:
    """A number of reward.json as its text: read by parse_number, never by int() (a 5,000-digit one raises)."""

    text: str


def parse_reward_json(raw: bytes, key: str | None = None) -> Parsed:
    """Harbor's reading: a flat object whose numeric values are the metrics (booleans and other values ignored);
    the reward is `key` when the task names one, else the `reward` key, else the only metric there is. No reward
    by that rule: value None (the caller reads reward.txt for it when the task writes both, as Harbor does)."""
    try:
        text = raw.decode("utf-8")
        data = loads_json(text, where="reward.json", limits=REWARD_JSON_LIMITS, number=_JsonNumber)
    except (ValueError, UnicodeDecodeError) as error:
        return Parsed(None, f"reward.json is not JSON: {str(error)[:200]}")
    if not isinstance(data, dict):
        return Parsed(None, f"reward.json must be an object, got {type(data).__name__}")
    metrics: dict[str, float] = {}
    for name, value in data.items():
        number = parse_number(value.text) if isinstance(value, _JsonNumber) else None
        if number is not None and len(name) <= MAX_METRIC_KEY and len(metrics) < MAX_METRICS:
            metrics[name] = number
    wanted = key or "reward"
    if wanted in data:
        chosen = data[wanted]
        value = parse_number(chosen.text) if isinstance(chosen, _JsonNumber) else None
        if value is None:
            return Parsed(None, f"reward.json's {wanted!r} is not a number: {_shown(repr(chosen))}", metrics)
        return Parsed(value, metrics=metrics)
    if key is None and len(metrics) == 1:
        return Parsed(next(iter(metrics.values())), metrics=metrics)
    named = f"the task's reward_key {key!r}" if key else "a 'reward' key or a single metric"
    return Parsed(None, f"reward.json has no {named}: keys {sorted(data)[:10]}", metrics, names_reward=False)


def pass_rate(results: Sequence[CommandResult]) -> float | None:
    if not results:
        return None
    return sum(1 for result in results if result.exit_code == 0) / len(results)


def killed(result: CommandResult) -> bool:
    """The command did not end by itself: timed out, or ended by a signal (its own or a kill of its group)."""
    code = result.exit_code
    return result.timed_out or code is None or code < 0 or code > SIGNAL_EXIT


READ_LIMIT = REWARD_JSON_LIMITS.max_chars + 1
"""A reward file is read up to this many bytes (its tail): one that long is over reward.json's size limit and far
past a number's, so it parses as no reward, and no backend's whole-file read limit is ever reached."""


PATHS: dict[RewardFile, str] = {"reward.json": REWARD_JSON, "reward.txt": REWARD_TXT}
SOURCES: dict[RewardFile, RewardSource] = {"reward.json": "reward_json", "reward.txt": "reward_txt"}


def judge(
    found: Mapping[RewardFile, bytes | None],
    verify_results: Sequence[CommandResult],
    *,
    reward_range: tuple[float, float] = (0.0, 1.0),
    reward_key: str | None = None,
) -> Reward:
    """The reward from what the host read at each declared file's path (None: not the regular file it made), and
    how verify's commands ended (pure). No declared file: the pass rate."""
    if not found:
        rate = pass_rate(verify_results)
        return Reward(rate, "verify_pass_rate" if rate is not None else "none")
    declared = tuple(found)
    source = SOURCES[declared[0]]
    forged = [PATHS[name] for name, raw in found.items() if raw is None]
    if forged:
        return _zero(source, "reward_forged", f"{' and '.join(forged)} replaced (not the file the host made)", forged)
    cut = [result.cmd for result in verify_results if killed(result)]
    if cut:
        return _zero(source, "verify_killed", f"verify ended by a kill or a timeout: {cut[0][:200]}", cut[:1])
    oversize = [PATHS[name] for name, raw in found.items() if raw is not None and len(raw) >= READ_LIMIT]
    if oversize:
        return _zero(source, "reward_unparsable", f"{oversize[0]} is over {READ_LIMIT - 1} bytes", oversize)
    written = {name: raw for name, raw in found.items() if raw and raw.strip(WHITESPACE)}
    if not written:
        return Reward(0.0, source, f"no reward file written ({', '.join(declared)})")
    parsed = _parse(written, reward_key)
    if parsed is None:
        paths = [PATHS[name] for name in written]
        return _zero(source, "reward_file", f"{' and '.join(paths)} both written", paths)
    name, result = parsed
    where = [PATHS[name]]
    if result.value is None:
        return _zero(SOURCES[name], "reward_unparsable", result.problem or "", where, result.metrics)
    low, high = reward_range
    if not (math.isfinite(result.value) and low <= result.value <= high):
        problem = f"{PATHS[name]} holds {result.value!r}, outside [{low}, {high}]"
        return _zero(SOURCES[name], "reward_out_of_range", problem, where, result.metrics)
    return Reward(result.value, SOURCES[name], metrics=result.metrics)


def _parse(written: Mapping[RewardFile, bytes], key: str | None) -> tuple[RewardFile, Parsed] | None:
    """The file the reward comes from and its reading; None when both are written and neither is Harbor's detail
    file (a reward.json naming no reward beside a reward.txt holding it)."""
    if len(written) == 1:
        name, raw = next(iter(written.items()))
        return name, _READERS[name](raw, key)
    detail = parse_reward_json(written["reward.json"], key)
    if detail.names_reward or detail.problem is None or key is not None:
        return None
    scalar = parse_reward_txt(written["reward.txt"])
    return "reward.txt", Parsed(scalar.value, scalar.problem, detail.metrics)


def _read_txt(raw: bytes, _key: str | None) -> Parsed:
    return parse_reward_txt(raw)


_READERS: dict[RewardFile, Callable[[bytes, str | None], Parsed]] = {
    "reward.json": parse_reward_json,
    "reward.txt": _read_txt,
}


def _zero(
    source: RewardSource,
    finding: FindingKind,
    problem: str,
    paths: Sequence[str],
    metrics: dict[str, float] | None = None,
) -> Reward:
    return Reward(0.0, source, problem, finding, tuple(paths), metrics or {})


def _shown(raw: bytes | str, limit: int = 80) -> str:
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


async def read_declared(sandbox: Sandbox, declared: Sequence[RewardFile]) -> dict[RewardFile, bytes | None]:
    """Each declared file's bytes (at most READ_LIMIT), read without following a link; None when the path holds no
    regular file (the host made one there before verify: only a replacement can be missing)."""
    found: dict[RewardFile, bytes | None] = {}
    for name in declared:
        try:
            found[name] = await sandbox.read_tail(PATHS[name], READ_LIMIT)
        except FileNotFoundError:
            found[name] = None
    return found


async def read_reward(
    sandbox: Sandbox,
    verify_results: Sequence[CommandResult],
    declared: Sequence[RewardFile],
    *,
    reward_range: tuple[float, float] = (0.0, 1.0),
    reward_key: str | None = None,
) -> Reward:
    found = await read_declared(sandbox, declared)
    return judge(found, verify_results, reward_range=reward_range, reward_key=reward_key)
