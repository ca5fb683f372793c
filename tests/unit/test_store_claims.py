"""OpenCode's session store is a file OpenCode's own write tool can reach through a link, so it only labels: a store
replaced, re-parented or garbage (real SQLite files, read by the real reader) changes no turn's kind, no count and
no trained turn; its claims are ignored, named, and warned of."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from opencode_env.rollout import collect_phase
from opencode_env.rollout.attribution import attribution_check
from opencode_env.rollout.opencode_store import StoreUnavailable, parse_store
from opencode_env.training.sequences import training_sequences
from opencode_env.wire import AttributionCheck, RolloutTurn
from tests.integration.test_training import result_of, turn

ROOT, CHILD = "ses_root", "ses_child"
EOS = 99


def recorded() -> list[RolloutTurn]:
    """The proxy's record of a root session that started one sub-agent (only OpenCode's uid could call)."""
    turns = []
    for number, session in enumerate([ROOT, CHILD, CHILD, ROOT]):
        call = turn(number, [1, 2, 3, number], [10 + number, EOS])
        call.headers = {"x-session-id": session}
        turns.append(call)
    return turns


def store_file(path: Path, sessions: dict[str, str | None], steps: list[tuple[str, int]]) -> Path:
    database = sqlite3.connect(path)
    database.execute("CREATE TABLE session (id TEXT PRIMARY KEY, parent_id TEXT, title TEXT)")
    database.execute("CREATE TABLE message (id TEXT PRIMARY KEY, session_id TEXT, time_created INTEGER, data TEXT)")
    database.executemany("INSERT INTO session VALUES (?, ?, '')", list(sessions.items()))
    answer = json.dumps({"role": "assistant", "finish": "stop", "tokens": {"output": 2}})
    database.executemany(
        "INSERT INTO message VALUES (?, ?, ?, ?)",
        [(f"msg_{n}", session, created, answer) for n, (session, created) in enumerate(steps)],
    )
    database.commit()
    database.close()
    return path


HONEST = ({ROOT: None, CHILD: ROOT}, [(ROOT, 1), (CHILD, 2), (CHILD, 3), (ROOT, 4)])
CLAIMS = {
    "replaced: OpenCode's sessions gone, another's in their place": (
        {"ses_fake": None},
        [("ses_fake", 1), ("ses_fake", 2)],
    ),
    "the sub-agent re-parented onto a session that never called": (
        {ROOT: None, CHILD: "ses_ghost", "ses_ghost": None},
        HONEST[1],
    ),
    "the roles swapped": ({CHILD: None, ROOT: CHILD}, HONEST[1]),
    "steps added that no call made": (HONEST[0], [*HONEST[1], (ROOT, 5), (ROOT, 6)]),
}


def trained(turns: list[RolloutTurn]) -> list[tuple[list[int], list[int], str, str | None]]:
    """What a trainer gets, labels aside: each sequence's turns, completion ids, kind and session."""
    found = training_sequences(result_of(*turns)).sequences
    return [(s.turns, s.completion_ids, s.kind, s.session_id) for s in found]


def labels(turns: list[RolloutTurn]) -> list[tuple[str, str | None, str | None]]:
    return [(t.kind, t.session_id, t.parent_session_id) for t in turns]


@pytest.mark.parametrize("claim", sorted(CLAIMS))
def test_a_lying_store_changes_no_kind_and_no_trained_turn(tmp_path: Path, claim: str) -> None:
    honest_turns = recorded()
    honest, _ = attribution_check(
        honest_turns, parse_store(store_file(tmp_path / "honest.db", *HONEST)), callers_checked=True
    )
    assert labels(honest_turns) == [
        ("agent", ROOT, None),
        ("sub_agent", CHILD, ROOT),
        ("sub_agent", CHILD, ROOT),
        ("agent", ROOT, None),
    ]
    assert (honest.disagreements, attribution_warnings(honest, store_expected=True)) == ([], [])

    turns = recorded()
    check, marked = attribution_check(
        turns, parse_store(store_file(tmp_path / "lying.db", *CLAIMS[claim])), callers_checked=True
    )
    assert marked == 0
    assert [t.kind for t in turns] == [t.kind for t in honest_turns]
    assert [t.session_id for t in turns] == [t.session_id for t in honest_turns]
    assert all(t.parent_session_id in (None, ROOT) for t in turns)
    assert (check.sessions, check.sub_agent_sessions) == (2, 1)
    assert trained(turns) == trained(honest_turns)
    assert check.disagreements
    [warning] = attribution_warnings(check, store_expected=True) or [""]
    assert "contradicts the proxy's record" in warning or "no complete turn" in " ".join(check.disagreements)


def attribution_warnings(check: AttributionCheck, *, store_expected: bool) -> list[str]:
    return [notice.message for notice in collect_phase.attribution_warnings(check, store_expected=store_expected)]


def test_a_store_overwritten_with_garbage_costs_the_parents_only(tmp_path: Path) -> None:
    garbage = tmp_path / "opencode.db"
    garbage.write_text("garbage " * 100)
    with pytest.raises(StoreUnavailable) as unreadable:
        parse_store(garbage)
    turns = recorded()
    check, marked = attribution_check(turns, None, str(unreadable.value), callers_checked=True)
    assert (marked, check.source) == (0, "headers_only")
    assert labels(turns) == [
        ("agent", ROOT, None),
        ("sub_agent", CHILD, None),
        ("sub_agent", CHILD, None),
        ("agent", ROOT, None),
    ]
    [warning] = attribution_warnings(check, store_expected=True)
    assert "OpenCode's session store could not be read" in warning
    assert "sub-agents' parents unknown" in warning


def test_refused_calls_are_warned_of() -> None:
    check, _ = attribution_check(recorded(), None, None, callers_checked=True)
    check.refused_calls = 3
    assert attribution_warnings(check, store_expected=True) == [
        "3 model calls were refused by the capture proxy (not OpenCode's connection, or no valid token): never sent "
        "to the model, never a turn"
    ]
