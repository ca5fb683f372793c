"""A result's warnings, typed: each has a code, a severity and (where there is one) a fix; the result and the CLI's
summary show the most serious first; a result written before notices existed reads as it was."""

from __future__ import annotations

import json
from pathlib import Path

from opencode_env.cli.support import summarize
from opencode_env.rollout.collect_phase import attribution_warnings
from opencode_env.rollout.provenance import complete_provenance
from opencode_env.wire import AttributionCheck, RolloutResult
from opencode_env.wire.notices import UNCLASSIFIED
from tests.integration.test_training import result_of, turn

RESULT_V0 = Path(__file__).resolve().parents[1] / "fixtures" / "result_v0_demo.json"


def test_the_most_serious_comes_first_in_the_result_and_the_summary() -> None:
    result = RolloutResult()
    result.warn("project_config_removed", "a note", severity="note")
    result.warn("sampling_unrecorded", "a warning", fix="set sampling")
    result.warn("logprobs_not_finite", "an error", severity="error")
    result.order_warnings()
    assert result.warnings == ["an error", "a warning", "a note"]
    assert [notice.code for notice in result.notices] == [
        "logprobs_not_finite",
        "sampling_unrecorded",
        "project_config_removed",
    ]
    lines = [line for line in summarize(result).splitlines() if line.split(":")[0] in ("error", "warning", "note")]
    assert lines == ["error:      an error", "warning:    a warning (fix: set sampling)", "note:       a note"]


def test_a_result_written_before_notices_reads_with_its_warnings_as_they_were() -> None:
    data = json.loads(RESULT_V0.read_text())
    data["warnings"] = ["an old warning"]
    old = RolloutResult.model_validate_json(json.dumps(data))
    assert old.notices == []
    [notice] = old.warning_notices()
    assert (notice.code, notice.severity, notice.message) == (UNCLASSIFIED, "warning", "an old warning")
    assert RolloutResult.model_validate_json(old.model_dump_json()).warnings == ["an old warning"]


def test_attribution_warnings_apply_only_to_what_happened() -> None:
    assert attribution_warnings(AttributionCheck(), store_expected=True) == []
    refused = attribution_warnings(AttributionCheck(refused_calls=2), store_expected=True)
    assert [(notice.code, notice.severity) for notice in refused] == [("calls_refused", "note")]
    unread = AttributionCheck(sessions=1, note="no store")
    assert attribution_warnings(unread, store_expected=False) == []
    assert [notice.code for notice in attribution_warnings(unread, store_expected=True)] == ["session_store_unread"]


def test_non_finite_logprobs_are_an_error_only_where_a_turn_carries_them() -> None:
    finite = result_of(turn(0, [1, 2], [10, 11]))
    complete_provenance(finite, None, frozenset())
    assert finite.notices == []
    broken = result_of(turn(0, [1, 2], [10, 11]))
    broken.proxy_turns[0].per_token_logps = [float("nan"), -0.5]
    complete_provenance(broken, None, frozenset())
    assert [(notice.code, notice.severity) for notice in broken.notices] == [("logprobs_not_finite", "error")]
