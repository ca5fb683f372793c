"""Token-in mode: an agent turn's prompt is the last turn's prompt + completion ids, then the new messages' ids, so
the model sees its own earlier tokens exactly and a rollout is one training sequence, not one per turn (a chat
template that drops earlier reasoning would fork it). The routes (prime-rl's `tokens`, stock vLLM's `forwarded`),
the suffix taken from the server's own `/tokenize`, and when a turn falls back to the chat route are in
docs/training.md. Pure except for `TokenIn.plan`'s two /tokenize calls, which the proxy's shell passes in."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

CHAT_ROUTE = "/chat/completions"
TOKENS_ROUTE = "/chat/completions/tokens"
Route = Literal["tokens", "forwarded"]
ROUTES: tuple[Route, ...] = ("tokens", "forwarded")
"""Every route, in the order of preference (see the module's docstring)."""
PROMPT_SOURCE: dict[Route, str] = {"tokens": "token_in", "forwarded": "forwarded_ids"}
"""What a turn records as its `prompt_source` when it went by each route."""
ELIGIBLE_KINDS = ("agent", "sub_agent")
RENDERING_FIELDS = ("tools", "chat_template_kwargs", "chat_template", "model")
"""Request fields the template's rendering depends on besides the messages: a change in any is a new prompt."""
SETTLE_WAIT_S = 30.0
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"})
MEDIA_PART_KEYS = frozenset(
    {
        "input_image", "image_url", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds", "image_pil",
        "audio_url", "input_audio", "video_url",
    }
)  # fmt: skip
"""Content part types vLLM 0.32 counts as text, and the keys that make any part media (`renderers/chat_utils.py`,
`has_non_text_content`): a message with any other part makes it ignore forwarded ids."""

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
    """How to send one turn: `prompt_ids` to send by `route` (token-in), or None with the reason the chat route is
    used."""

    prompt_ids: list[int] | None
    fallback: str | None
    route: Route | None = None


@dataclass
class Ticket:
    """A turn on its way, to be settled once its record is written."""

    session: str
    messages: list[Any]
    rendering: str
    sent_ids: list[int] | None = None
    route: Route | None = None


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
        parted = next((at for at, (a, b) in enumerate(zip(base, full, strict=False)) if a != b), len(full))
        return (
            "the template renders the history differently once messages follow it (it looks at the whole history, "
            f"so a suffix cannot be rendered alone): the renders part at id {parted} of {len(base)}"
        )
    for position in range(len(base) - 1, -1, -1):
        if base[position] == stop_id:
            suffix = full[position + 1 :]
            return suffix or "the new messages render to no ids"
    return "the rendered history holds no stop token where the reply ends"


def suffix_in_full(full: list[int], marked: list[int], base: list[int], stop_id: int) -> list[int] | str:
    """The ids after the reply in `full` (the whole history with a generation prompt), for a template that renders
    the reply differently once messages follow it: the reply ends at the last `stop_id` before the first new
    message's content, which is where `marked` (the same history with that content changed) parts from `full`; it
    must close as many messages as `base` (the history through the reply) does, or the end found is not the reply's."""
    parted = next((at for at, (a, b) in enumerate(zip(full, marked, strict=False)) if a != b), None)
    if parted is None:
        return "a changed new message renders to the same ids, so where the new messages start is not known"
    end = next((at for at in range(parted - 1, -1, -1) if full[at] == stop_id), None)
    if end is None or full[: end + 1].count(stop_id) != base.count(stop_id):
        first = next((at for at, (a, b) in enumerate(zip(base, full, strict=False)) if a != b), len(full))
        return (
            "the template renders the history differently once messages follow it (it looks at the whole history), "
            f"and the reply's end cannot be found in the whole render: the renders part at id {first} of {len(base)}"
        )
    return full[end + 1 :] or "the new messages render to no ids"


def marked_messages(messages: list[Any], start: int) -> list[Any]:
    """`messages` with the content of `messages[start]` changed at its first character (A or B, whichever it does
    not start with), so its render parts from the original's where that content begins."""
    message = dict(messages[start])
    content = message.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = str(content[0].get("text", ""))
        content = [{**content[0], "text": ("B" if text.startswith("A") else "A") + text}, *content[1:]]
    else:
        text = content if isinstance(content, str) else ""
        content = ("B" if text.startswith("A") else "A") + text
    message["content"] = content
    return [*messages[:start], message, *messages[start + 1 :]]


def forwarding_refused(request: dict[str, Any]) -> str | None:
    """Why vLLM would ignore or refuse prompt ids forwarded with this chat request (it renders the messages then),
    or None."""
    if request.get("echo"):
        return "the request sets echo, which makes vLLM render the messages instead of taking forwarded ids"
    messages = request.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], list):
        return "a batch request: vLLM refuses forwarded prompt ids for several conversations"
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict):
                continue
            kind = part.get("type", "text")
            if kind not in TEXT_PART_TYPES or MEDIA_PART_KEYS.intersection(part):
                return f"a message has a {kind!r} content part, which makes vLLM render the messages instead"
    return None


def routed_body(request: dict[str, Any], route: Route, ids: list[int]) -> tuple[str, dict[str, Any]]:
    """The path and body that send `request` with its prompt as `ids` by `route`."""
    if route == "tokens":
        return TOKENS_ROUTE, {**request, "tokens": ids}
    forwarded = dict(request.get("kv_transfer_params") or {})
    forwarded["prompt_token_ids"] = ids
    return CHAT_ROUTE, {**request, "kv_transfer_params": forwarded}


def request_body(request: dict[str, Any], messages: list[Any], *, generation_prompt: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "add_generation_prompt": generation_prompt}
    body.update({name: request[name] for name in RENDERING_FIELDS if request.get(name) is not None})
    return body


async def rendered_suffix(
    request: dict[str, Any], messages: list[Any], start: int, stop_id: int, tokenize: Tokenize
) -> list[int] | str:
    """The ids the server's template puts after the reply `messages[start - 1]` (ending in `stop_id`): the new
    messages from `start` on and the generation prompt; or why they cannot be rendered alone."""
    base, full = await asyncio.gather(
        tokenize(request_body(request, messages[:start], generation_prompt=False)),
        tokenize(request_body(request, messages, generation_prompt=True)),
    )
    if isinstance(base, str) or isinstance(full, str):
        return base if isinstance(base, str) else str(full)
    suffix = suffix_after_reply(base, full, stop_id)
    if isinstance(suffix, str) and full[: len(base)] != base:
        marked = await tokenize(request_body(request, marked_messages(messages, start), generation_prompt=True))
        suffix = marked if isinstance(marked, str) else suffix_in_full(full, marked, base, stop_id)
    return suffix


def parse_routes(name: str) -> tuple[Route, ...]:
    """The routes the proxy may use for `--token-in NAME`: auto tries each in order; none uses no route."""
    if name == "auto":
        return ROUTES
    if name == "none":
        return ()
    if name in ROUTES:
        return (name,)
    raise ValueError(f"token-in route {name!r}: one of auto, tokens, forwarded, none")


@dataclass
class TokenIn:
    """The sessions' states and the server's routes, as far as they are known.

    `routes`: the routes still believed to work, best first (the one the probe proved, or every route when the
    server was not probed: each is then tried, and dropped at its first failure with the reason kept)."""

    routes: tuple[Route, ...] = ROUTES
    sessions: dict[str, SessionState] = field(default_factory=dict)
    in_flight: dict[str, asyncio.Event] = field(default_factory=dict)
    unsupported: str | None = None
    dropped: dict[Route, str] = field(default_factory=dict)

    def ticket(self, request: dict[str, Any], session: str | None, kind: str) -> Ticket | str:
        if kind not in ELIGIBLE_KINDS:
            return f"a {kind} call"
        if not session:
            return "the call names no session (x-session-id)"
        messages = request.get("messages")
        if not isinstance(messages, list):
            return "the request has no message list"
        return Ticket(session, messages, rendering_key(request))

    def route(self) -> Route | None:
        return self.routes[0] if self.routes and not self.unsupported else None

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
        if self.route() is None:
            return Plan(None, self.why_none())
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
        suffix = await rendered_suffix(request, ticket.messages, start, state.stop_id, tokenize)
        if isinstance(suffix, str):
            return Plan(None, suffix)
        route = self.route()
        if route is None:
            return Plan(None, self.why_none())
        if route == "forwarded" and (refused := forwarding_refused(request)) is not None:
            return Plan(None, refused)
        ticket.sent_ids, ticket.route = state.ids + suffix, route
        return Plan(ticket.sent_ids, None, route)

    def why_none(self) -> str:
        if self.unsupported:
            return self.unsupported
        return "; ".join(self.dropped.values()) or "no token-in route was enabled"

    def route_missing(self, reason: str, route: Route | None = None) -> None:
        """The server lacks something token-in needs: `route` (that route only), or /tokenize (every route). Every
        later turn takes the next route, or the chat route when none is left."""
        if route is None:
            self.unsupported = reason
            return
        self.dropped[route] = reason
        self.routes = tuple(kept for kept in self.routes if kept != route)

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
