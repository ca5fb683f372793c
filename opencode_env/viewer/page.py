"""One self-contained HTML page for a rollout: inline CSS and JS, no network. Two JSON blocks: the result, and
its training sequences as `opencode_env.training.sequences` computes them (the page never re-derives the merge rule).
"""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, Field, field_serializer

from opencode_env.training.sequences import (
    TrainingSequence,
    TrainingSummary,
    training_sequences,
    training_summary,
)
from opencode_env.wire import RolloutResult, WireFloat

# Inside <script type="application/json"> the HTML parser only stops at "</script" (or changes state at "<!--"),
# so escaping every "<" (and ">", "&" for good measure) as a JSON \u escape makes hostile text inert; U+2028/9
# are escaped so the block stays valid even if someone evaluates it as JavaScript.
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_ESCAPE_TABLE = str.maketrans(_JSON_ESCAPES)
_ID_LISTS = {"prompt_ids", "completion_ids", "logprobs", "env_mask"}


@cache
def asset(name: str) -> str:
    return resources.files("opencode_env.viewer").joinpath("assets", name).read_text(encoding="utf-8")


def csp_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def embed_json(json_text: str) -> str:
    """JSON text made safe to sit inside a <script type="application/json"> element."""
    return json_text.translate(_ESCAPE_TABLE)


def content_security_policy(scripts: list[str], styles: list[str], connect: str = "'none'") -> str:
    """Only our own inline script and style run; no fetch, image, font or frame can reach the network."""
    return (
        "default-src 'none'; "
        f"script-src {' '.join(csp_hash(s) for s in scripts)}; "
        f"style-src {' '.join(csp_hash(s) for s in styles)}; "
        f"img-src data:; connect-src {connect}; base-uri 'none'; form-action 'none'"
    )


def html_document(title: str, body: str, scripts: list[str], styles: list[str], connect: str = "'none'") -> str:
    csp = content_security_policy(scripts, styles, connect)
    style_tags = "".join(f"<style>{style}</style>" for style in styles)
    script_tags = "".join(f"<script>{script}</script>" for script in scripts)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{title}</title>{style_tags}</head><body>{body}{script_tags}</body></html>\n"
    )


class SequenceSegment(BaseModel):
    """A stretch of a sequence's completion: the environment's tokens before a turn, then the turn's own tokens."""

    turn: int | None = Field(description="RolloutTurn.turn; None when the mask could not be split by turn.")
    environment_tokens: int
    model_tokens: int


class SequenceView(BaseModel):
    """One training sequence as the page draws it: its shape and its fields, not its ids (those would repeat every
    prompt, turns x context, which the result's compact prompts avoid; `opencode-env export` writes them)."""

    sequence: TrainingSequence = Field(description="Serialized without its id, logprob and mask lists.")
    prompt_tokens: int
    model_tokens: int
    environment_tokens: int
    mean_logprob: WireFloat | None = Field(description="Over the model's tokens; None when it has none.")
    trl_row: bool = Field(description="The sequence a TRL row carries (the one with the last usable agent turn).")
    segments: list[SequenceSegment]

    @field_serializer("sequence")
    def _without_ids(self, sequence: TrainingSequence) -> dict[str, Any]:
        return sequence.model_dump(mode="json", exclude=_ID_LISTS)


class TrainingView(BaseModel):
    sequences: list[SequenceView] = Field(default_factory=list)
    summary: TrainingSummary | None = None
    unavailable: str | None = Field(
        None, description="Why nothing could be computed (a result with broken references)."
    )


def _mask_runs(mask: list[int]) -> list[SequenceSegment]:
    runs: list[SequenceSegment] = []
    for bit in mask:
        if not runs or (bit == 0 and runs[-1].model_tokens):
            runs.append(SequenceSegment(turn=None, environment_tokens=0, model_tokens=0))
        if bit:
            runs[-1].model_tokens += 1
        else:
            runs[-1].environment_tokens += 1
    return runs


def _segments(sequence: TrainingSequence, lengths: dict[int, int]) -> list[SequenceSegment]:
    """Per covered turn: the environment's tokens (mask 0) before it, then its completion (mask 1)."""
    mask, position, segments = sequence.env_mask, 0, []
    for turn in sequence.turns:
        start = position
        while position < len(mask) and mask[position] == 0:
            position += 1
        model = lengths.get(turn, 0)
        if mask[position : position + model] != [1] * model:
            # Two calls numbered alike make the lengths ambiguous: draw the mask's runs, unlabelled, instead.
            return _mask_runs(mask)
        segments.append(SequenceSegment(turn=turn, environment_tokens=position - start, model_tokens=model))
        position += model
    return segments if position == len(mask) else _mask_runs(mask)


def _sequence_view(sequence: TrainingSequence, lengths: dict[int, int], trl_row: bool) -> SequenceView:
    model = [lp for lp, bit in zip(sequence.logprobs, sequence.env_mask, strict=False) if bit]
    return SequenceView(
        sequence=sequence,
        prompt_tokens=len(sequence.prompt_ids),
        model_tokens=len(model),
        environment_tokens=len(sequence.env_mask) - len(model),
        mean_logprob=sum(model) / len(model) if model else None,
        trl_row=trl_row,
        segments=_segments(sequence, lengths),
    )


def training_view(result: RolloutResult) -> TrainingView:
    """What the page shows of the rollout's training data: every sequence's shape, and the summary in full."""
    try:
        found = training_sequences(result)
    except ValueError as error:
        # A hand-edited or truncated file can name a turn that is not there; the page still shows the rest.
        return TrainingView(unavailable=str(error)[:500])
    lengths = {turn.turn: len(turn.completion_token_ids) for turn in result.proxy_turns if turn.outcome == "complete"}
    final = found.final()
    return TrainingView(
        sequences=[_sequence_view(sequence, lengths, sequence is final) for sequence in found.sequences],
        summary=training_summary(result, found),
    )


def json_block(element_id: str, json_text: str) -> str:
    return f'<script type="application/json" id="{element_id}">{embed_json(json_text)}</script>'


def render_page(result: RolloutResult) -> str:
    """The viewer page for one result; opens offline in any browser."""
    body = (
        '<div id="app"></div>'
        + json_block("rollout-data", result.model_dump_json())
        + json_block("training-data", training_view(result).model_dump_json())
    )
    return html_document("opencode-env rollout", body, [asset("viewer.js")], [asset("viewer.css")])
