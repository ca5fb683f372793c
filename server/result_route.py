"""`GET /results/{id}`: a finished result by reference, behind the server's access rule like every route, gzip on
the wire (plain JSON to a client that does not accept gzip)."""

from __future__ import annotations

import gzip

from fastapi import APIRouter, HTTPException, Request, Response

from opencode_env.server.result_store import ResultStore
from opencode_env.wire.answer import RESULT_PATH


def results_router(store: ResultStore) -> APIRouter:
    router = APIRouter()

    @router.get(RESULT_PATH + "/{ref}", include_in_schema=False)
    async def result(ref: str, request: Request) -> Response:
        stream = store.gzip_of(ref)
        if stream is None:
            raise HTTPException(
                404, f"no result for that id (unknown, or past its {store.retention_s:.0f} s retention)"
            )
        headers = {"cache-control": "private, no-store", "vary": "accept-encoding"}
        if "gzip" in request.headers.get("accept-encoding", "").lower():
            return Response(stream, media_type="application/json", headers={**headers, "content-encoding": "gzip"})
        return Response(gzip.decompress(stream), media_type="application/json", headers=headers)

    return router
