"""Results serialized off the loop and spliced into their WebSocket frame: the text is the observation's result
exactly, and a frame only ever receives its own connection's results."""

from __future__ import annotations

import json

from openenv.core.env_server.mcp_types import CallToolObservation
from openenv.core.env_server.serialization import serialize_observation
from openenv.core.env_server.types import WSObservationResponse

from opencode_env.wire.models import CommandResult, RolloutResult, RolloutTurn
from server.spliced import PLACEHOLDER_PREFIX, Splices
from server.tool_result import session_tool_result, session_tool_result_json


def awkward_result() -> RolloutResult:
    turn = RolloutTurn(
        turn=0,
        completion_tokens=['"', "\\", "\u2028", "é", "</script>"],
        completion_token_ids=[1, 2, 3, 4, 5],
        per_token_logps=[-0.0, -1e-300, -123.456789012345, -2.5e-7, float("-inf")],
        prompt_token_ids=[151644, 0],
    )
    return RolloutResult(
        task_id='quote " backslash \\ newline \n',
        reward=0.25,
        error="line\nbreak\ttab",
        proxy_turns=[turn],
        verify_results=[CommandResult(cmd="echo \u00e9", exit_code=0, stdout="\x00\x1f", stderr="")],
    )


def frame(result: object) -> str:
    """The frame OpenEnv's WebSocket handler sends for an observation with this result."""
    observation = CallToolObservation(tool_name="run_rollout", result=result)
    return WSObservationResponse(data=serialize_observation(observation)).model_dump_json()


def test_the_spliced_frame_is_the_frame_the_result_would_have_made() -> None:
    result = awkward_result()
    splices = Splices()
    spliced = splices.splice(frame(splices.hold(session_tool_result_json(result))))
    assert json.loads(spliced) == json.loads(frame(session_tool_result(result)))
    assert (
        json.loads(spliced)["data"]["observation"]["result"]["data"]["proxy_turns"][0]["per_token_logps"][4]
        == "-Infinity"
    )


def test_a_frame_gets_its_held_text_once_and_nothing_else() -> None:
    splices = Splices()
    placeholder = splices.hold('{"a":[1,2]}')
    assert placeholder.startswith(PLACEHOLDER_PREFIX)
    forged = json.dumps(PLACEHOLDER_PREFIX + "0" * 32)
    frame = json.dumps({"result": placeholder, "echo": PLACEHOLDER_PREFIX + "0" * 32})
    spliced = splices.splice(frame)
    assert json.loads(spliced) == {"result": {"a": [1, 2]}, "echo": PLACEHOLDER_PREFIX + "0" * 32}
    assert forged in spliced
    assert splices.pending == 0
    assert splices.splice(frame) == frame
