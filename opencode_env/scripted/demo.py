"""The demo task: OpenCode writes add.py; two verify commands check it and write the reward file."""

from __future__ import annotations

from opencode_env.wire import Mode, RolloutRequest

DEMO_INSTRUCTION = (
    "Create /home/user/workdir/add.py with a function add(a, b) that returns a + b, then check that it works."
)
DEMO_VERIFY = [
    "cd /home/user/workdir && python3 -c 'from add import add; assert add(2, 3) == 5 and add(-1, 1) == 0'",
    "cd /home/user/workdir && python3 -c 'from add import add; print(float(add(0.5, 0.5)))'"
    " > /home/user/logs/verifier/reward.txt",
]


def demo_request(base_url: str, *, mode: Mode = "transparent_proxy", **overrides: object) -> RolloutRequest:
    fields: dict[str, object] = {
        "endpoint": "vllm",
        "base_url": base_url,
        "model": "scripted-policy",
        "api_key": "sk-demo-not-a-secret",
        "instruction": DEMO_INSTRUCTION,
        "verify": DEMO_VERIFY,
        "task_id": "demo_add_v1",
        "mode": mode,
        "agent_timeout_s": 120.0,
    }
    fields.update(overrides)
    return RolloutRequest.model_validate(fields)
