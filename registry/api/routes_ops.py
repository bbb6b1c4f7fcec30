"""Routes: audit log, replicas and prewarm (delegated to the router's ReplicaDirectory), health."""

from __future__ import annotations

from datetime import UTC
from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import JSONResponse

from kit.errors import Conflict, Unavailable
from kit.inputs import UtcDatetime
from registry.api.deps import read, state_of
from registry.api.schemas import AuditOut, AuditPage, PrewarmBody, ReplicaList
from registry.api.scopes import OWNER_OF_ADAPTER
from registry.auth import Principal
from registry.auth.dependencies import requires
from registry.services import adapters as adapter_svc
from registry.services import audit as audit_svc

router = APIRouter()

Reader = Annotated[Principal, Depends(requires("read"))]


@router.get("/audit", response_model=AuditPage, tags=["audit"])
def list_audit(
    request: Request,
    who: Reader,
    limit: Annotated[int | None, Query()] = None,
    cursor: Annotated[str | None, Query()] = None,
    action: str | None = None,
    subject_type: str | None = None,
    subject_id: str | None = None,
    since: Annotated[UtcDatetime | None, Query(description="ISO 8601; naive times are UTC.")] = None,
    order: Annotated[
        Literal["asc", "desc"], Query(description="asc: oldest first (the default); desc: newest first.")
    ] = "asc",
) -> AuditPage:
    """Audit events, oldest first (``order=desc``: newest first)."""
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    page = read(
        state_of(request),
        lambda s: audit_svc.list_events(
            s,
            limit=limit,
            cursor=cursor,
            action=action,
            subject_type=subject_type,
            subject_id=subject_id,
            since=since,
            order=order,
        ),
    )
    return AuditPage(data=[AuditOut.model_validate(r) for r in page.data], next_cursor=page.next_cursor)


def _directory(request: Request) -> Any:
    directory = state_of(request).replica_directory
    if directory is None:
        raise Unavailable("no replica directory is attached to this admin API", code="replicas_unavailable")
    return directory


@router.get("/replicas", tags=["replicas"], responses={200: {"model": ReplicaList}})
async def list_replicas(request: Request, who: Reader) -> dict[str, Any]:
    """Every replica the router knows (SPEC §13 replica record)."""
    directory = _directory(request)
    try:
        records = await directory.list_replicas()
    except Exception as e:
        raise Unavailable(f"replica directory failed: {e}", code="replicas_unavailable") from e
    return {"data": list(records), "next_cursor": None}


@router.post("/adapters/{adapter_id}/prewarm", status_code=202, tags=["replicas"])
async def prewarm(
    request: Request,
    adapter_id: str,
    who: Annotated[Principal, Depends(requires("adapter.prewarm", scope=OWNER_OF_ADAPTER))],
    body: Annotated[PrewarmBody | None, Body()] = None,
) -> JSONResponse:
    """Load the adapter's active version onto ``replicas`` replicas now (default 1)."""
    n = body.replicas if body is not None else 1
    st = state_of(request)
    rec = await anyio.to_thread.run_sync(lambda: read(st, lambda s: adapter_svc.get_adapter(s, adapter_id)))
    if rec.status == "disabled":
        raise Conflict(f"adapter {adapter_id!r} is disabled", code="adapter_disabled")
    if rec.active_version is None:
        raise Conflict(f"adapter {adapter_id!r} has no active version", code="no_active_version")
    directory = _directory(request)
    try:
        ack = await directory.request_prewarm(adapter_id, rec.active_version, n)
    except Exception as e:
        raise Unavailable(f"prewarm request failed: {e}", code="replicas_unavailable") from e
    out = dict(ack) if isinstance(ack, dict) else {"ack": ack}
    out.setdefault("adapter_id", adapter_id)
    out.setdefault("version", rec.active_version)
    out.setdefault("replicas", n)
    return JSONResponse(status_code=202, content=out)
