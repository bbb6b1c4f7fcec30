"""Routes of SPEC §16: regression sets, quality policies, evaluations.

Permissions: reading needs ``read``; storing a regression set or a quality policy changes how
the adapter is judged, so it needs ``adapter.update``; starting an evaluation needs
``evaluation.run`` (all scoped to the adapter's owner).

The evaluation worker (:class:`registry.quality.worker.EvaluationWorker`) lives on
``app.state.evaluator``; :func:`attach_evaluator` creates it and the app's lifespan starts and
stops it.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Body, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from kit.errors import PayloadTooLarge, Unavailable
from registry.api.deps import AdminState, read, state_of, write
from registry.api.scopes import OWNER_OF_ADAPTER
from registry.auth import Principal
from registry.auth.dependencies import requires
from registry.quality import service
from registry.quality.cases import MAX_SET_BYTES
from registry.quality.settings import EvaluatorSettings
from registry.quality.worker import EvaluationWorker

router = APIRouter(tags=["quality"])

Reader = Annotated[Principal, Depends(requires("read"))]
Updater = Annotated[Principal, Depends(requires("adapter.update", scope=OWNER_OF_ADAPTER))]
Evaluator = Annotated[Principal, Depends(requires("evaluation.run", scope=OWNER_OF_ADAPTER))]

_SET_BODY = {
    "requestBody": {
        "required": True,
        "description": "JSON Lines (one case per line) or a JSON array of cases (SPEC §16).",
        "content": {
            "application/jsonl": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "array"}},
        },
    }
}


def attach_evaluator(app: FastAPI, st: AdminState, settings: EvaluatorSettings | None) -> EvaluationWorker:
    """Create the app's evaluation worker (not started: the lifespan starts it)."""

    def tx(fn: Any) -> Any:
        return write(st, fn)

    worker = EvaluationWorker(settings or EvaluatorSettings(), tx)
    app.state.evaluator = worker
    return worker


def _worker(request: Request) -> EvaluationWorker:
    worker = getattr(request.app.state, "evaluator", None)
    if not isinstance(worker, EvaluationWorker):
        raise Unavailable("no evaluation worker in this process", code="evaluator_unavailable")
    return worker


@router.put("/adapters/{adapter_id}/regression-set", openapi_extra=_SET_BODY)
async def put_regression_set(request: Request, adapter_id: str, who: Updater) -> dict[str, Any]:
    """Store a new version of the adapter's regression set (422 ``invalid_request`` with every
    problem in ``details.problems``); the same cases as the latest version store nothing."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_SET_BYTES:
            raise PayloadTooLarge(f"the regression set is over {MAX_SET_BYTES} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    st = state_of(request)
    rec, _created = await anyio.to_thread.run_sync(
        lambda: write(st, lambda s: service.put_regression_set(s, adapter_id, body, actor=who.id))
    )
    return rec


@router.get("/adapters/{adapter_id}/regression-set")
def get_regression_set(
    request: Request,
    adapter_id: str,
    who: Reader,
    version: Annotated[
        int | None, Query(ge=1, description="An older version of the set (default: latest).")
    ] = None,
) -> dict[str, Any]:
    return read(state_of(request), lambda s: service.get_regression_set(s, adapter_id, version))


@router.put("/adapters/{adapter_id}/quality-policy")
def put_quality_policy(
    request: Request, adapter_id: str, who: Updater, body: Annotated[dict[str, Any], Body()]
) -> dict[str, Any]:
    """``{"min_pass_rate", "max_regression_pp", "max_format_error_rate"}`` (each optional; null or
    missing: the default)."""
    return write(state_of(request), lambda s: service.put_policy(s, adapter_id, body, actor=who.id))


@router.get("/adapters/{adapter_id}/quality-policy")
def get_quality_policy(request: Request, adapter_id: str, who: Reader) -> dict[str, Any]:
    return read(state_of(request), lambda s: service.get_policy(s, adapter_id))


@router.post("/adapters/{adapter_id}/versions/{version}/evaluations", status_code=202)
def start_evaluation(request: Request, adapter_id: str, version: str, who: Evaluator) -> JSONResponse:
    """Start an evaluation of ``version`` against the base model and the active version; 202 with
    the record (``status`` ``running``). 409 ``no_regression_set``, ``evaluation_running``,
    ``adapter_disabled``, ``version_disabled``."""
    worker = _worker(request)
    here = worker.settings.eval_in_process  # else a `serve --role evaluator` process claims it

    def start(s: Session) -> dict[str, Any]:
        owner = worker.worker_id if here else None
        return service.start_evaluation(s, adapter_id, version, actor=who.id, worker=owner)

    rec = write(state_of(request), start)
    if here:
        worker.submit(rec["id"])
    return JSONResponse(status_code=202, content=rec)


@router.get("/adapters/{adapter_id}/versions/{version}/evaluations")
def list_evaluations(
    request: Request,
    adapter_id: str,
    version: str,
    who: Reader,
    limit: Annotated[int | None, Query()] = None,
    cursor: Annotated[str | None, Query()] = None,
) -> dict[str, Any]:
    """The version's evaluations, newest first (without ``result``)."""
    return read(
        state_of(request),
        lambda s: service.list_evaluations(s, adapter_id, version, limit=limit, cursor=cursor),
    )


@router.get("/adapters/{adapter_id}/evaluations")
def list_adapter_evaluations(
    request: Request,
    adapter_id: str,
    who: Reader,
    limit: Annotated[int | None, Query()] = None,
    cursor: Annotated[str | None, Query()] = None,
) -> dict[str, Any]:
    """Every evaluation of the adapter, newest first (without ``result``)."""
    return read(
        state_of(request), lambda s: service.list_evaluations(s, adapter_id, None, limit=limit, cursor=cursor)
    )


@router.get("/adapters/{adapter_id}/versions/{version}/evaluations/{eval_id}")
def get_evaluation(
    request: Request, adapter_id: str, version: str, eval_id: str, who: Reader
) -> dict[str, Any]:
    """One evaluation with its progress and, once finished, its ``result`` (SPEC §16)."""
    return read(state_of(request), lambda s: service.get_evaluation(s, adapter_id, version, eval_id))
