"""The local backend's handle on a rollout's capture proxy: admin calls over its unix socket, files read host-side."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx

from opencode_env.sandbox.base import BackgroundProcess
from opencode_env.sandbox.local.files import hostfs

ADMIN_BASE_URL = "http://proxy"


class AdminCallsAtDebug(logging.Filter):
    """httpx logs every request at INFO; the admin calls to a rollout's proxy (a health or status poll every ~1 s per
    rollout) were most of a server's log. They are kept for DEBUG only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if ADMIN_BASE_URL + "/" not in record.getMessage():
            return True
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


logging.getLogger("httpx").addFilter(AdminCallsAtDebug())


class LocalProxy:
    def __init__(self, process: BackgroundProcess, private: Path, admin_socket: Path, *, port: int, token: str) -> None:
        self.process = process
        self._private = private
        self._admin_socket = admin_socket
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.token = token
        self.status_interval_s = 1.0

    async def running(self) -> bool:
        return await self.process.running()

    async def kill(self) -> None:
        await self.process.kill()

    async def call(self, path: str, method: str, wait_s: float) -> dict[str, Any] | None:
        # No TLS on a unix socket: verify=False keeps httpx from loading the CA bundle into a new SSL context on
        # every call (42 ms of CPU and ~0.9 MB of OpenSSL memory each, once a second per rollout, freed only when
        # the gc's rare full collection reached the client). bench.server_memory, 10 rollouts: the server's RSS went
        # 195 -> 369 MB with it, 195 -> 210 MB without.
        transport = httpx.AsyncHTTPTransport(uds=str(self._admin_socket), verify=False)
        headers = {"authorization": f"Bearer {self.token}"}
        deadline = asyncio.get_running_loop().time() + wait_s
        async with httpx.AsyncClient(
            transport=transport, base_url=ADMIN_BASE_URL, headers=headers, trust_env=False, verify=False
        ) as client:
            while True:
                try:
                    answer = await client.request(method, path, timeout=max(wait_s, 1.0))
                    data = answer.json()
                    return data if isinstance(data, dict) else None
                except (httpx.TransportError, json.JSONDecodeError):
                    if asyncio.get_running_loop().time() > deadline or not await self.process.running():
                        return None
                    await asyncio.sleep(0.02)

    async def read(self, name: str, limit: int) -> bytes:
        try:
            return await asyncio.to_thread(hostfs.read_tail, self._private, name, limit)
        except (FileNotFoundError, hostfs.UnsafePath):
            return b""
