from __future__ import annotations

import json

import pytest

from opencode_env.rollout.collect import decode_text
from opencode_env.rollout.endpoints import EndpointError, resolve_upstream
from opencode_env.rollout.grading.reward import parse_reward_json, parse_reward_txt, pass_rate
from opencode_env.rollout.opencode import parse_events, render_config
from opencode_env.sandbox.local.isolation.host_view import trust_settings
from opencode_env.sandbox.output import BoundedOutput
from opencode_env.settings import Settings
from opencode_env.wire import CommandResult, RolloutRequest


def request(**fields: object) -> RolloutRequest:
    return RolloutRequest.model_validate({"instruction": "do it", **fields})


def test_explicit_arguments_win_over_env_and_env_over_defaults() -> None:
    env = {"OPENAI_API_KEY": "sk-env", "OPENAI_MODEL": "gpt-env"}
    upstream = resolve_upstream(request(endpoint="openai", model="gpt-arg"), Settings.load(env))
    assert (upstream.base_url, upstream.api_key, upstream.model) == ("https://api.openai.com/v1", "sk-env", "gpt-arg")
    assert upstream.disable_thinking is False


def test_vllm_disables_thinking_by_default_and_needs_no_key() -> None:
    env = {"VLLM_URL": "http://gpu:8000/v1/", "VLLM_MODEL": "Qwen/Qwen3-8B"}
    upstream = resolve_upstream(request(endpoint="vllm"), Settings.load(env))
    assert upstream.base_url == "http://gpu:8000/v1"
    assert upstream.disable_thinking is True
    assert (
        resolve_upstream(request(endpoint="vllm", disable_thinking=False), Settings.load(env)).disable_thinking is False
    )


def test_missing_pieces_are_named() -> None:
    with pytest.raises(EndpointError, match=r"api_key missing for endpoint 'hf_router'.*HF_ROUTER_API_KEY"):
        resolve_upstream(request(endpoint="hf_router", model="m"), Settings.load({}))
    with pytest.raises(EndpointError, match="base_url, model missing for a custom endpoint"):
        resolve_upstream(request(), Settings.load({}))


def test_upstream_repr_hides_the_key() -> None:
    upstream = resolve_upstream(request(base_url="http://x/v1", model="m", api_key="sk-very-secret"), Settings.load({}))
    assert "sk-very-secret" not in repr(upstream)
    assert "sk-very-secret" not in upstream.info().model_dump_json()


def test_reward_parsers() -> None:
    assert parse_reward_txt(b" 0.25\n").value == 0.25
    assert parse_reward_json(b'{"reward": 1, "tests": 3}').value == 1.0
    for bad in (b"nan", b"", b"high", b"1_0", "\uff11".encode()):
        assert parse_reward_txt(bad).value is None, bad
    assert parse_reward_json(b'{"score": 1, "other": 2}').value is None


def test_pass_rate_counts_exit_zero_only() -> None:
    results = [CommandResult(cmd="a", exit_code=0), CommandResult(cmd="b", exit_code=None, timed_out=True)]
    assert pass_rate(results) == 0.5
    assert pass_rate([]) is None


def test_bounded_output_keeps_head_and_tail() -> None:
    out = BoundedOutput(10)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"):
        out.feed(chunk)
    assert out.truncated
    assert out.total == 26
    assert out.text().startswith("abcde")
    assert out.text().endswith("vwxyz")
    assert "16 bytes dropped" in out.text()
    small = BoundedOutput(100)
    small.feed(b"hello")
    assert (small.text(), small.truncated) == ("hello", False)


def test_binary_files_are_detected() -> None:
    assert decode_text(b"plain text\n") == "plain text\n"
    assert decode_text(b"\x00\x01") is None
    assert decode_text(b"\xff\xfe") is None


def test_config_references_the_key_by_env_var_only() -> None:
    config = render_config(base_url="http://127.0.0.1:9/v1", model_id="policy", max_tokens_cap=512, model_options={})
    text = json.dumps(config)
    assert "{env:OPENCODE_ENV_UPSTREAM_KEY}" in text
    assert config["provider"]["rollout"]["models"]["policy"]["limit"]["output"] == 512
    assert "tools" not in config
    assert config["permission"] == {"*": "allow", "question": "deny", "webfetch": "deny", "task": "deny"}
    assert (config["snapshot"], config["lsp"], config["formatter"]) == (False, False, False)


def test_events_are_summarized() -> None:
    lines = [
        {
            "type": "tool_use",
            "part": {"tool": "bash", "state": {"status": "completed", "title": "ls", "metadata": {"exit": 2}}},
        },
        {"type": "step_finish", "part": {"tokens": {"input": 100, "output": 7}}},
        {"type": "text", "part": {"text": "All done."}},
        {"type": "step_finish", "part": {"tokens": {"input": 120, "output": 3}}},
        {"type": "error", "error": {"name": "APIError", "data": {"message": "boom"}}},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\nnot json\n"
    events = parse_events(text)
    assert [(c.tool, c.status, c.exit_code) for c in events.tool_calls] == [("bash", "completed", 2)]
    assert (events.input_tokens, events.output_tokens, events.steps) == (220, 10, 2)
    assert events.final_text == "All done."
    assert "boom" in events.errors[0]
    assert events.unparsed_lines == 1


def test_request_rejects_unknown_fields_and_bad_bounds() -> None:
    with pytest.raises(ValueError, match="top_logprobs"):
        request(top_logprobs=21)
    with pytest.raises(ValueError, match="mode"):
        request(mode="white_box")
    with pytest.raises(ValueError, match="extra"):
        request(temperature=0.1)


def test_only_trust_settings_pass_from_the_host_environment() -> None:
    host = {
        "SSL_CERT_FILE": "/etc/ssl/ca.pem",
        "HTTPS_PROXY": "http://user:pw@proxy",
        "OPENAI_API_KEY": "sk-x",
        "PIP_INDEX_URL": "https://user:token@index/simple",
    }
    assert trust_settings(host) == {"SSL_CERT_FILE": "/etc/ssl/ca.pem", "NPM_CONFIG_CAFILE": "/etc/ssl/ca.pem"}
    assert trust_settings({}) == {}
