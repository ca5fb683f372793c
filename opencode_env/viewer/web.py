"""The server's web page at /web: every rollout the server runs (whichever transport started it) with its phases
live, the finished ones kept across restarts (`server.runs.ResultsDir`); a form that runs one more; each result
opened in the viewer.

The page itself holds no data and is served without the token (a browser sends no bearer header on navigation);
it asks for the token once, keeps it in sessionStorage, and sends it with every call to /web/api/*, which the
server's bearer middleware guards like every other route.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel

from opencode_env.server.runs import OtherServers, Runner, Runs, RunsFull, RunView, ServerOrigin
from opencode_env.viewer.page import TrainingView, asset, content_security_policy, html_document, training_view
from opencode_env.wire import RolloutRequest, RolloutResult

WEB_PATH = "/web"
WEB_OPEN_PATHS = frozenset({"/", WEB_PATH})
"""The page and the redirect to it carry no data; the bearer middleware lets a browser reach them."""


class ServerView(BaseModel):
    """Which server this page is (each run's `server` is compared with it), and what it does not list."""

    origin: ServerOrigin
    others: OtherServers


def web_page() -> str:
    scripts, styles = [asset("viewer.js"), asset("web.js")], [asset("viewer.css"), asset("web.css")]
    return html_document("opencode-env", asset("web.html"), scripts, styles, connect="'self'")


def web_router(runs: Runs, runner: Runner) -> APIRouter:
    """Routes under /web: `runs` lists every rollout of the server; the form's own run through `runner` (the
    server's, behind its concurrency cap)."""
    router = APIRouter()
    page = web_page()
    csp = content_security_policy(
        [asset("viewer.js"), asset("web.js")], [asset("viewer.css"), asset("web.css")], "'self'"
    )

    @router.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(WEB_PATH)

    @router.get(WEB_PATH, response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page, headers={"content-security-policy": csp, "cache-control": "no-store"})

    @router.get(WEB_PATH + "/api/runs")
    async def list_runs() -> list[RunView]:
        return runs.views()

    @router.get(WEB_PATH + "/api/server")
    async def this_server() -> ServerView:
        return ServerView(origin=runs.origin, others=await runs.others())

    @router.post(WEB_PATH + "/api/runs", status_code=202)
    async def start_run(request: RolloutRequest) -> RunView:
        try:
            return runs.start(request, runner)
        except RunsFull as full:
            raise HTTPException(status_code=429, detail=str(full)) from full

    @router.get(WEB_PATH + "/api/runs/{run_id}")
    async def get_run(run_id: str) -> RunView:
        view = runs.view(run_id)
        if view is None:
            raise HTTPException(status_code=404, detail=f"no run {run_id[:40]!r} (only the last {runs.kept} are kept)")
        return view

    @router.get(WEB_PATH + "/api/runs/{run_id}/result")
    async def get_result(run_id: str) -> Response:
        result = await runs.result_json(run_id)
        if result is None:
            raise HTTPException(status_code=404, detail=f"run {run_id[:40]!r} has no result (unknown or not finished)")
        return Response(result, media_type="application/json")

    @router.get(WEB_PATH + "/api/runs/{run_id}/training")
    async def get_training(run_id: str) -> TrainingView:
        """The run's training sequences, forks and coverage, as the viewer shows them (computed here, once)."""
        result = await runs.result_json(run_id)
        if result is None:
            raise HTTPException(status_code=404, detail=f"run {run_id[:40]!r} has no result (unknown or not finished)")
        return await asyncio.to_thread(lambda: training_view(RolloutResult.model_validate_json(result)))

    return router
