"""Token-in mode: an agent turn's prompt is the last turn's prompt + completion ids, then the new messages' ids.

A chat template renders the whole history again on every call, and many drop what the model generated (earlier
reasoning, an empty think block), so turn N+1's prompt no longer starts with turn N's prompt + completion and the
rollout splits into one training sequence per turn. In token-in mode the proxy sends the engine the ids themselves
(prime-rl's vLLM route `/v1/chat/completions/tokens`, a chat request plus `tokens`): the model sees its own earlier
tokens exactly, and every turn extends the last by construction.

The new messages' ids come from the server's own `/tokenize` (vLLM): the history through the assistant's reply is
rendered without a generation prompt (`base`) and the whole history with one (`full`); when `base` is a prefix of
`full`, the ids after the reply's stop token in `base` are the ones the template puts after that reply. The reply
itself is never rendered again: its ids are the sampled ones.

Anything that is not a plain continuation falls back to the chat route, with the reason recorded on the turn: a
session's first turn, a history that was rewritten (compaction) or whose tools changed, a reply that did not end with
a stop token, a server without the routes.

Pure except for `TokenIn.plan`'s two /tokenize calls, which the proxy's shell passes in as a function.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

TOKENS_ROUTE = "/chat/completions/tokens"
ELIGIBLE_KINDS = ("agent", "sub_agent")
RENDERING_FIELDS = ("tools", "chat_template_kwargs", "chat_template", "model")
"""Request fields the template's rendering depends on besides the messages: a change in any is a new prompt."""
SETTLE_WAIT_S = 30.0

Tokenize = Callable[[dict[str, Any]], Awaitable[list[int] | str]]
"""POST /tokenize with this body: the ids, or why there are none."""


@dataclass
class SessionState:
    """What the last completed turn of one session sent and got back."""

    messages: list[Any]
    rendering: str
    ids: list[int]
    stop_id: int | None


@dataclass(frozen=True)
class Plan:
    """How to send one turn: `prompt_ids` to send (token-in), or None with the reason the chat route is used."""

    prompt_ids: list[int] | None
    fallback: str | None


@dataclass
class Ticket:
    """A turn on its way, to be settled once its record is written."""

    session: str
    messages: list[Any]
    rendering: str
    sent_ids: list[int] | None = None


def rendering_key(request: dict[str, Any]) -> str:
    return json.dumps([request.get(name) for name in RENDERING_FIELDS], sort_keys=True, default=str)


def new_messages_start(state: SessionState, messages: list[Any]) -> int | str:
    """Where the messages added since the last turn start (after its messages and the assistant's reply), or why
    this history does not continue the last turn."""
    before = len(state.messages)
    if len(messages) <= before + 1 or messages[:before] != state.messages:
        return "the history was rewritten since the last turn (compaction, a truncated or edited history)"
    reply = messages[before]
    if not isinstance(reply, dict) or reply.get("role") != "assistant":
        return "the message after the last turn's history is not the assistant's reply"
    return before + 1


def suffix_after_reply(base: list[int], full: list[int], stop_id: int) -> list[int] | str:
    """The ids `full` has after the reply that `base` ends with (the reply ends at `base`'s last `stop_id`)."""
    if full[: len(base)] != base:
        return "the template renders the history differently once messages follow it"
    for position in range(len(base) - 1, -1, -1):
        if base[position] == stop_id:
            suffix = full[position + 1 :]
            return suffix or "the new messages render to no ids"
    return "the rendered history holds no stop token where the reply ends"


def request_body(request: dict[str, Any], messages: list[Any], *, generation_prompt: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "add_generation_prompt": generation_prompt}
    body.update({name: request[name] for name in RENDERING_FIELDS if request.get(name) is not None})
    return body


@dataclass
class TokenIn:
    """The sessions' states and the server's routes, as far as they are known."""

    sessions: dict[str, SessionState] = field(default_factory=dict)
    in_flight: dict[str, asyncio.Event] = field(default_factory=dict)
    unsupported: str | None = None

    def ticket(self, request: dict[str, Any], session: str | None, kind: str) -> Ticket | str:
        if kind not in ELIGIBLE_KINDS:
            return f"a {kind} call"
        if not session:
            return "the call names no session (x-session-id)"
        messages = request.get("messages")
        if not isinstance(messages, list):
            return "the request has no message list"
        return Ticket(session, messages, rendering_key(request))

    async def plan(self, ticket: Ticket, request: dict[str, Any], tokenize: Tokenize) -> Plan:
        """Wait for the session's previous turn to be settled, then decide how this one goes."""
        previous = self.in_flight.get(ticket.session)
        if previous is not None:
            try:
                await asyncio.wait_for(previous.wait(), SETTLE_WAIT_S)
            except TimeoutError:
                self.in_flight[ticket.session] = asyncio.Event()
                return Plan(None, "the session's previous turn was still open")
        self.in_flight[ticket.session] = asyncio.Event()
        if self.unsupported:
            return Plan(None, self.unsupported)
        state = self.sessions.get(ticket.session)
        if state is None:
            return Plan(None, "the session's first turn")
        if state.rendering != ticket.rendering:
            return Plan(None, "the tools or the template settings changed since the last turn")
        if state.stop_id is None:
            return Plan(None, "the last turn's reply did not end with a stop token")
        start = new_messages_start(state, ticket.messages)
        if isinstance(start, str):
            return Plan(None, start)
        base = await tokenize(request_body(request, ticket.messages[:start], generation_prompt=False))
        full = await tokenize(request_body(request, ticket.messages, generation_prompt=True))
        if isinstance(base, str):
            return Plan(None, base)
        if isinstance(full, str):
            return Plan(None, full)
        suffix = suffix_after_reply(base, full, state.stop_id)
        if isinstance(suffix, str):
            return Plan(None, suffix)
        ticket.sent_ids = state.ids + suffix
        return Plan(ticket.sent_ids, None)

    def route_missing(self, reason: str) -> None:
        """The server lacks a route token-in needs: every later turn takes the chat route."""
        self.unsupported = reason

    def settle(
        self, ticket: Ticket, prompt_ids: list[int], completion_ids: list[int], finish_reason: str | None
    ) -> None:
        """Remember a completed turn (its prompt as the engine reported it) and let the session's next turn go."""
        stopped = finish_reason in ("stop", "tool_calls") and bool(completion_ids)
        self.sessions[ticket.session] = SessionState(
            ticket.messages,
            ticket.rendering,
            prompt_ids + completion_ids,
            completion_ids[-1] if stopped else None,
        )
        self.release(ticket)

    def forget(self, ticket: Ticket) -> None:
        """A turn that did not complete: the next one starts from the chat route again."""
        self.sessions.pop(ticket.session, None)
        self.release(ticket)

    def release(self, ticket: Ticket) -> None:
        event = self.in_flight.get(ticket.session)
        if event is not None:
            event.set()
