"""Calls the proxy refuses are counted in its trace, never turns, and a caller refused in a loop cannot grow it."""

from __future__ import annotations

from pathlib import Path

from opencode_env.proxy.records import REFUSED_LINES, TraceWriter
from opencode_env.rollout.proxy_session import parse_trace


def test_refusals_are_counted_in_bounded_lines(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(str(path))
    for port in range(REFUSED_LINES + 50):
        writer.write_refused("not_opencode", f"127.0.0.2:{port}")
    writer.write_refused_total()
    writer.close()
    lines = path.read_text().splitlines()
    assert len(lines) == REFUSED_LINES + 1
    trace = parse_trace(path.read_text())
    assert (trace.refused, trace.turns, trace.problems) == (REFUSED_LINES + 50, [], [])


def test_a_few_refusals_need_no_total_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(str(path))
    writer.write_refused("no_token", "127.0.0.1:4000")
    writer.write_refused_total()
    writer.close()
    assert len(path.read_text().splitlines()) == 1
    assert parse_trace(path.read_text()).refused == 1
