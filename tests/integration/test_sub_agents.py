"""Every call attributed: OpenCode's sub-agents (the task tool) as sub_agent turns tied to their parent through
OpenCode's own store, read from the host side; the store's steps checked against the proxy's record."""

from __future__ import annotations

from opencode_env.rollout.attribution import OpenCodeStore, StoredStep, attribution_check
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash, say, task
from opencode_env.wire import RolloutTurn

ROOT, CHILD = "ses_root", "ses_child"


def turn(number: int, session: str | None, kind: str = "agent", tokens: int = 5) -> RolloutTurn:
    headers = {"x-session-id": session} if session else {}
    return RolloutTurn(turn=number, kind=kind, headers=headers, usage={"completion_tokens": tokens})  # type: ignore[arg-type]


def store() -> OpenCodeStore:
    steps = [StoredStep(session, number, "stop", 5, error=False) for number, session in enumerate([ROOT, CHILD, ROOT])]
    return OpenCodeStore(parents={ROOT: None, CHILD: ROOT}, steps=steps)


def test_calls_are_tied_to_their_sessions_and_a_child_to_its_parent() -> None:
    turns = [turn(0, ROOT), turn(1, CHILD), turn(2, ROOT), turn(3, None, "auxiliary"), turn(4, ROOT, "auxiliary")]
    check, marked = attribution_check(turns, store(), callers_checked=True)
    assert [(t.kind, t.session_id, t.parent_session_id) for t in turns] == [
        ("agent", ROOT, None),
        ("sub_agent", CHILD, ROOT),
        ("agent", ROOT, None),
        ("unattributed", None, None),
        ("auxiliary", ROOT, None),
    ]
    assert (marked, check.source, check.sessions, check.sub_agent_sessions) == (1, "opencode_store", 2, 1)
    assert (check.steps_recorded, check.turns_matched, check.disagreements) == (3, 3, [])


def test_a_turn_missing_from_the_record_and_a_session_the_store_does_not_know_are_reported() -> None:
    """Only OpenCode's uid could connect: a session the store does not know is still OpenCode's (its header), a
    sub-agent with no parent; the store's session that made no captured call is ignored."""
    turns = [turn(0, ROOT), turn(2, ROOT), turn(4, "ses_unknown"), turn(5, None)]
    check, marked = attribution_check(turns, store(), callers_checked=True)
    assert [(t.kind, t.parent_session_id) for t in turns] == [
        ("agent", None),
        ("agent", None),
        ("sub_agent", None),
        ("unattributed", None),
    ]
    assert marked == 1
    assert check.disagreements == [
        "session ses_unknown: made calls the proxy captured but is not in OpenCode's store (kept as a sub-agent, "
        "parent unknown)",
        f"session {CHILD}: in OpenCode's store but made no call the proxy captured (ignored)",
        "turn 4 (ses_unknown): no step in OpenCode's store",
    ]


def test_without_the_caller_check_only_the_root_session_is_opencode_s() -> None:
    turns = [turn(0, ROOT), turn(1, CHILD), turn(2, ROOT)]
    check, marked = attribution_check(turns, store())
    assert [t.kind for t in turns] == ["agent", "unattributed", "agent"]
    assert (marked, check.sessions, check.caller_check) == (1, 1, False)


def test_more_output_than_the_engine_sent_is_a_disagreement() -> None:
    turns = [turn(0, ROOT, tokens=2), turn(1, CHILD), turn(2, ROOT)]
    check, _ = attribution_check(turns, store(), callers_checked=True)
    assert check.disagreements == [f"turn 0 ({ROOT}): OpenCode counted 5 output tokens, the engine sent 2"]


def test_without_a_store_the_record_alone_decides_and_only_the_parents_are_unknown() -> None:
    turns = [turn(0, ROOT), turn(1, CHILD), turn(2, ROOT)]
    check, marked = attribution_check(turns, None, "no store here", callers_checked=True)
    assert [(t.kind, t.parent_session_id) for t in turns] == [("agent", None), ("sub_agent", None), ("agent", None)]
    assert (marked, check.source, check.note, check.sessions) == (0, "headers_only", "no store here", 2)
    headers_only = [turn(0, ROOT), turn(1, CHILD), turn(2, ROOT)]
    check, marked = attribution_check(headers_only, None, "not read on this backend")
    assert [t.kind for t in headers_only] == ["agent", "unattributed", "agent"]


async def test_a_sub_agent_s_calls_are_its_own_with_their_parent(backend: LocalBackend, no_leaks: None) -> None:
    script = Script(steps=[task("Count the files in the work dir."), say("The sub-agent counted them.")])
    sub_script = Script(steps=[bash("ls /home/user/workdir | wc -l", "Count files"), say("There are 0 files.")])
    with ScriptedModelServer(script, sub_script=sub_script) as model:
        result = await run_rollout(demo_request(model.base_url, sub_agents=True, verify=[]), backend)
    assert result.status == "completed", result.error
    kinds = [(t.kind, t.session_id, t.parent_session_id) for t in result.proxy_turns]
    root = kinds[0][1]
    child = kinds[1][1]
    assert root
    assert child
    assert child != root
    assert kinds == [
        ("agent", root, None),
        ("sub_agent", child, root),
        ("sub_agent", child, root),
        ("agent", root, None),
    ]
    check = result.attribution
    assert check is not None
    assert (check.source, check.sessions, check.sub_agent_sessions) == ("opencode_store", 2, 1)
    assert (check.steps_recorded, check.turns_matched, check.disagreements) == (4, 4, [])
    assert [call.tool for call in result.tool_calls if call.session_id == root] == ["task"]


async def test_without_sub_agents_the_task_tool_is_refused(backend: LocalBackend, no_leaks: None) -> None:
    script = Script(steps=[task("Count the files."), say("Done.")])
    with ScriptedModelServer(script, sub_script=Script(steps=[say("never")])) as model:
        result = await run_rollout(demo_request(model.base_url, verify=[]), backend)
    assert result.status == "completed", result.error
    assert {t.kind for t in result.proxy_turns} == {"agent"}
    assert len({t.session_id for t in result.proxy_turns}) == 1
    assert result.attribution is not None
    assert (result.attribution.sessions, result.attribution.disagreements) == (1, [])
