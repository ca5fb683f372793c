"""The chat template's fingerprint: the server's own rendering of one fixed conversation, hashed.

Pure and shared: the host's endpoint probe (preflight/probe.py) and the capture proxy (on every call) send the same
body to the server's `/tokenize` and hash the ids it answers, so two fingerprints are equal exactly when the server
rendered the conversation to the same ids. A template that changes between calls (a server restarted with another
template, a load balancer over differently configured replicas) changes the fingerprint.
"""

from __future__ import annotations

import hashlib
from typing import Any

PROBE_MESSAGES: tuple[dict[str, Any], ...] = (
    {"role": "system", "content": "You are a probe."},
    {"role": "user", "content": "Say ok."},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": "Again."},
)
"""System, user, assistant and user again: the roles and the history a template renders differently."""

PROBE_HEADER = "x-opencode-env-probe"
"""Sent on the probe's own calls (not on the agent's): a log or a test double can tell them apart."""


def tokenize_body(model: str) -> dict[str, Any]:
    """The `/tokenize` body whose answer is fingerprinted (no chat_template_kwargs: the template's defaults)."""
    return {"model": model, "messages": list(PROBE_MESSAGES), "add_generation_prompt": True}


def fingerprint(token_ids: list[int]) -> str:
    """`sha256:` and the first 16 hex digits of the ids' digest."""
    digest = hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()
    return f"sha256:{digest[:16]}"
