from __future__ import annotations

import math

from opencode_env.rollout.provenance import complete_provenance
from opencode_env.wire import RolloutResult, RolloutTurn


def test_a_turn_with_logprobs_that_are_not_finite_is_a_warning() -> None:
    result = RolloutResult(
        proxy_turns=[
            RolloutTurn(turn=0, completion_token_ids=[5, 6], per_token_logps=[-0.5, -1.0]),
            RolloutTurn(turn=1, completion_token_ids=[0, 0], per_token_logps=[math.nan, -math.inf]),
        ]
    )
    complete_provenance(result, None, frozenset())
    assert [warning for warning in result.warnings if "not finite" in warning] == [
        "turns 1 carry logprobs that are not finite (NaN or infinite: vLLM sends them as null): their tokens cannot "
        "be trained on as they are"
    ]


def test_finite_logprobs_are_no_warning() -> None:
    result = RolloutResult(proxy_turns=[RolloutTurn(turn=0, completion_token_ids=[5], per_token_logps=[-0.5])])
    complete_provenance(result, None, frozenset())
    assert not any("not finite" in warning for warning in result.warnings)
