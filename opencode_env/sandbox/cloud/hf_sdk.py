"""The Hugging Face SDK's edge: its synchronous calls in our own threads under our own deadline, its exceptions
mapped to one `SandboxError` that says what to do, and the reaper that finds sandboxes by label."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import httpx2
from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.errors import SandboxError as HfSandboxError

from opencode_env.sandbox.base import SandboxError
from opencode_env.settings import variable

T = TypeVar("T")
CALL_TIMEOUT_S = 60.0
TAG = "opencode-env"


def sdk_error(error: BaseException, action: str, image: str = "") -> SandboxError:
    """One clear message for every way an SDK call fails."""
    status = getattr(error, "status_code", None)
    if status is None and isinstance(error, HfHubHTTPError) and error.response is not None:
        status = error.response.status_code
    if isinstance(error, HfSandboxError) and "token is required" in str(error):
        return SandboxError("HF_TOKEN is not set: the hf backend creates sandboxes with a Hugging Face token")
    if status == 401:
        return SandboxError(f"Hugging Face rejected the token while trying to {action}: check HF_TOKEN")
    if status == 402:
        return SandboxError(
            f"Hugging Face Jobs refused to {action} (HTTP 402): the account or namespace needs credits or a "
            "payment method for Jobs"
        )
    if status == 403:
        return SandboxError(
            f"Hugging Face refused to {action} (HTTP 403): the token needs permission to run Jobs in "
            f"its namespace (set {variable('hf_namespace')} for an organization)"
        )
    if status == 429:
        return SandboxError(
            f"Hugging Face rate limit while trying to {action}; lower {variable('hf_max_sandboxes')} or retry"
        )
    if isinstance(error, HfSandboxError) and ("did not become ready" in str(error) or "during startup" in str(error)):
        return SandboxError(
            f"the HF sandbox (image {image!r}) did not start: {error}. The image needs /bin/sh and sha256sum "
            "(curl or wget make the start faster)"
        )
    if isinstance(error, (httpx2.TransportError, OSError)) and not isinstance(error, HfHubHTTPError):
        return SandboxError(f"Hugging Face is unreachable while trying to {action}: {type(error).__name__}: {error}")
    if status is not None:
        return SandboxError(f"Hugging Face could not {action} (HTTP {status}): {error}")
    return SandboxError(f"could not {action} on Hugging Face: {type(error).__name__}: {error}")


class Calls:
    """Runs synchronous SDK calls in this backend's threads, each under our own deadline."""

    def __init__(self, threads: int) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="opencode-env-hf")

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        return self.executor.submit(fn)

    async def __call__(self, fn: Callable[[], T], *, timeout_s: float, action: str) -> T:
        running = asyncio.wrap_future(self.submit(fn))
        try:
            return await asyncio.wait_for(running, timeout=timeout_s)
        except TimeoutError as late:
            raise SandboxError(
                f"Hugging Face did not answer within {timeout_s:.0f} s while trying to {action}"
            ) from late
        except SandboxError:
            raise
        except Exception as error:
            raise sdk_error(error, action) from error


async def reap(*, older_than_s: float, api: Any = None, token: str = "", namespace: str = "") -> list[str]:
    """Kill the HF sandboxes tagged by this tool, in `namespace` (empty: the token's own), that have lived longer
    than `older_than_s`; returns their ids."""
    api = api or HfApi(token=token or get_token())

    def sweep() -> list[str]:
        now = time.time()
        killed = []
        for job in api.list_jobs(status=["RUNNING", "SCHEDULING"], labels={TAG: "1"}, namespace=namespace or None):
            born = job.created_at.timestamp() if job.created_at else now
            if now - born >= older_than_s:
                api.cancel_job(job_id=job.id, namespace=job.owner.name)
                killed.append(job.id)
        return killed

    try:
        return await asyncio.wait_for(asyncio.to_thread(sweep), timeout=CALL_TIMEOUT_S * 5)
    except TimeoutError as late:
        raise SandboxError("Hugging Face did not answer while reaping sandboxes") from late
    except Exception as error:
        raise sdk_error(error, "list or cancel sandbox jobs") from error
