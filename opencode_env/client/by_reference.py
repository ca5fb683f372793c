"""The whole `RolloutResult` a tool answer stands for: inline when small, else read from the server by its reference
(`GET <server><result_ref.path>`, gzip on the wire, checked against the answer's size and SHA-256).

Every transport answers `run_rollout` with a `RolloutAnswer` (see `opencode_env.wire.answer`); this is how a
client of any of them gets the result, with no message-size limit in the way. `OpenCodeEnv.run_rollout` calls it;
with OpenEnv's `MCPToolClient`:

    answer = await env.call_tool("run_rollout", **request)
    result = await fetch_result(base_url, answer, token=token)
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlsplit

import httpx

from opencode_env.client.ws_session import LOCAL_HOSTS, http_url
from opencode_env.wire import RolloutResult
from opencode_env.wire.answer import RolloutAnswer

READ_TIMEOUT_S = 600.0


class ResultFetchError(RuntimeError):
    """The whole result could not be read by its reference (gone past its retention, refused, or not what the
    answer said it would be)."""


def answer_of(data: Any) -> RolloutAnswer | None:
    """The tool's data as a RolloutAnswer; None when it is a whole RolloutResult already (an older server)."""
    if isinstance(data, RolloutAnswer):
        return data
    if isinstance(data, dict) and "result_ref" in data:
        return RolloutAnswer.model_validate(data)
    return None


async def fetch_result(
    base_url: str, answer: RolloutAnswer | dict[str, Any], *, token: str = "", connect_timeout_s: float = 10.0
) -> RolloutResult:
    """The whole result of `answer`, read from the server at `base_url` (the URL the client was given: the
    reference's path is joined to it, since the server may not know how it is reached)."""
    parsed = answer if isinstance(answer, RolloutAnswer) else RolloutAnswer.model_validate(answer)
    if parsed.result is not None:
        return parsed.result
    ref = parsed.result_ref
    if ref is None:
        raise ResultFetchError(f"the server kept no result for this rollout (status {parsed.status}: {parsed.error})")
    url = http_url(base_url) + ref.path
    headers = {"accept-encoding": "gzip", **({"authorization": f"Bearer {token}"} if token else {})}
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=connect_timeout_s)
    local = urlsplit(url).hostname in LOCAL_HOSTS
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=not local) as http:
            response = await http.get(url, headers=headers)
    except httpx.HTTPError as error:
        raise ResultFetchError(
            f"could not read the result at {http_url(base_url)}{ref.path[:20]}...: {error}"
        ) from error
    if response.status_code != 200:
        raise ResultFetchError(
            f"the server answered HTTP {response.status_code} for the result ({_reason(response)}); it is kept "
            f"{ref.retention_s:.0f} s after the rollout"
        )
    body = response.content
    if len(body) != ref.json_bytes or hashlib.sha256(body).hexdigest() != ref.sha256:
        raise ResultFetchError(
            f"the result read back is {len(body)} bytes that do not match the answer's {ref.json_bytes} and SHA-256"
        )
    return RolloutResult.model_validate_json(body)


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    return str(body.get("detail") or body.get("error") or body)[:200] if isinstance(body, dict) else str(body)[:200]
