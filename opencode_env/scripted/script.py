"""Scripts for the scripted model: a conversation is a list of steps, one step per chat-completion request."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field


class ToolCallStep(BaseModel):
    name: str
    arguments: dict[str, Any]

    def arguments_json(self) -> str:
        # Compact, like JSON.stringify, so the agent echoes the same text back in the next prompt.
        return json.dumps(self.arguments, ensure_ascii=False, separators=(",", ":"))


class Step(BaseModel):
    """What the model does for one request: a reply (text, reasoning, tool calls) and any fault to inject."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallStep] = Field(default_factory=list)
    status: int = Field(200, description="A non-200 status answers with an error body instead of a reply.")
    error_body: dict[str, Any] | None = None
    retry_after_s: float | None = None
    stall_before_s: float = 0.0
    stall_after_tokens: int | None = None
    stall_s: float = 0.0
    disconnect_after_tokens: int | None = None
    token_delay_s: float = 0.0
    tokens_per_chunk: int = Field(
        1,
        ge=1,
        description="Up to this many tokens of one segment per streamed chunk, as vLLM's --stream-interval sends "
        "them: a reply of tens of thousands of tokens streams in seconds, not in one event per token.",
    )


class Script(BaseModel):
    steps: list[Step]
    final_text: str = Field("Done.", description="Reply once the steps are used up, so the agent stops.")
    title: str = "Scripted task"


def say(text: str) -> Step:
    return Step(content=text)


def bash(command: str, description: str = "Run a command") -> Step:
    return Step(tool_calls=[ToolCallStep(name="bash", arguments={"command": command, "description": description})])


def write(path: str, content: str) -> Step:
    return Step(tool_calls=[ToolCallStep(name="write", arguments={"filePath": path, "content": content})])


def task(prompt: str, description: str = "A sub-task") -> Step:
    """Start a sub-agent (OpenCode's task tool; the request must allow sub_agents)."""
    arguments = {"description": description, "prompt": prompt, "subagent_type": "general"}
    return Step(tool_calls=[ToolCallStep(name="task", arguments=arguments)])


def fail(status: int, *, retry_after_s: float | None = None, message: str = "scripted failure") -> Step:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return Step(
        status=status,
        retry_after_s=retry_after_s,
        error_body={"error": {"message": message, "type": kind, "code": status}},
    )


def stall(seconds: float, *, after_tokens: int | None = None) -> Step:
    if after_tokens is None:
        return Step(content="late", stall_before_s=seconds)
    return Step(content="a reply that stalls half way " * 4, stall_after_tokens=after_tokens, stall_s=seconds)


def demo_script() -> Script:
    """The demo task: write a function, test it, and finish."""
    solution = "def add(a, b):\n    return a + b\n"
    return Script(
        steps=[
            write("/home/user/workdir/add.py", solution),
            bash("cd /home/user/workdir && python3 -c 'from add import add; print(add(2, 3))'", "Check add"),
            say("I wrote add.py with an add(a, b) function and checked that add(2, 3) is 5."),
        ]
    )
