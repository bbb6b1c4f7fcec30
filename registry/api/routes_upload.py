"""Route: upload a version (multipart, every part named ``files``) or register one by reference
(JSON ``{"source_uri": …}`` inside ``LORAPLANE_ALLOWED_SOURCES``: an ``s3://`` / ``file://``
prefix, or ``hf://ORG/REPO@REVISION[/SUBDIR]`` imported from the Hugging Face Hub).

The quality gate the version starts with (``skipped`` by default, or ``pending``) is the query
parameter ``quality_gate``, or in the body: a multipart text field ``quality_gate`` / the JSON
field ``quality_gate``. Giving it twice with different values is a 422; a bad value is a 422
before anything is kept (a bad multipart field stops the upload while it streams).

Order of events: 404 for an unknown adapter before the body is read; ``registry.ingest``
streams + validates into a pending upload (a refusal aborts it and consumes no number); then
one transaction inserts the version (number = max + 1) with its audit event and revision bump,
the pending files are committed *before* the database commit, and the change is published
only after both. If the database commit fails, the committed files are deleted again
(``pending.abort()`` removes committed files too), so nothing refers to missing files and no
files outlive a refused change; a request that ends between ingest and recording (its wait for
a worker thread cancelled) aborts the pending files too.
"""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from kit.db import session_scope
from kit.errors import InvalidRequest, Unavailable
from registry import ingest
from registry.api.deps import AdminState, state_of
from registry.api.schemas import UPLOAD_GATE_DOC, ErrorOut, SourceUpload, UploadQualityGate, VersionOut
from registry.api.scopes import OWNER_OF_ADAPTER
from registry.auth import Principal
from registry.auth.dependencies import requires
from registry.feed import bind_feed, publish_committed
from registry.services import adapters as adapter_svc
from registry.services import base_models as base_svc
from registry.services.gates import DEFAULT_UPLOAD_GATE, check_upload_gate
from registry.services.records import BaseModelRecord, VersionRecord
from registry.services.versions import register_version

router = APIRouter(tags=["versions"])

MAX_JSON_BODY = 64 * 1024

_UPLOAD_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
                        "quality_gate": {
                            "type": "string",
                            "enum": ["pending", "skipped"],
                            "description": UPLOAD_GATE_DOC,
                        },
                    },
                    "required": ["files"],
                }
            },
            "application/json": {"schema": SourceUpload.model_json_schema()},
        },
    }
}


def _lookup(st: AdminState, adapter_id: str) -> BaseModelRecord:
    with session_scope(st.factory) as session:
        adapter = adapter_svc.get_adapter(session, adapter_id)
        return base_svc.get_base_model(session, adapter.base_model)


def _spec(base: BaseModelRecord) -> Any:
    from registry.validation import BaseModelSpec

    return BaseModelSpec(
        name=base.name,
        hf_id=base.hf_id,
        max_lora_rank=base.max_lora_rank,
        target_modules=list(base.target_modules),
        module_shapes={k: list(v) for k, v in base.module_shapes.items()} if base.module_shapes else None,
    )


def _gate(query: str | None, body: str | None) -> str:
    """The version's starting gate from the query parameter and/or the body (they must agree)."""
    if query is not None and body is not None and query != body:
        raise InvalidRequest(
            f"quality_gate given twice with different values ({query!r} in the query, {body!r} in the body)",
            details={"field": "quality_gate"},
        )
    return check_upload_gate(body or query or DEFAULT_UPLOAD_GATE)


async def _read_source_body(request: Request) -> SourceUpload:
    raw = bytearray()
    async for chunk in request.stream():
        raw.extend(chunk)
        if len(raw) > MAX_JSON_BODY:
            raise InvalidRequest("JSON body too large")
    try:
        data = json.loads(bytes(raw))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidRequest("request body is not valid JSON") from None
    try:
        return SourceUpload.model_validate(data)
    except ValueError as e:
        raise InvalidRequest(
            'expected {"source_uri": "s3://bucket/prefix/" | "hf://ORG/REPO@REVISION", '
            '"quality_gate"?: "pending" | "skipped"}',
            details=str(e),
        ) from None


def _record(
    st: AdminState, adapter_id: str, result: Any, actor: str, gate_query: str | None, gate_body: str | None
) -> VersionRecord:
    pending = result.pending
    try:
        quality_gate = _gate(gate_query, gate_body)  # inside: a refusal aborts the pending files
        with session_scope(st.factory) as session:
            bind_feed(session, st.feed)
            rec = register_version(
                session,
                adapter_id,
                rank=result.rank,
                lora_alpha=result.lora_alpha,
                target_modules=result.target_modules,
                files=result.files,
                storage_uri=pending.storage_uri,
                actor=actor,
                quality_gate=quality_gate,
                source_uri=result.source_uri,
                source_revision=result.source_revision,
            )
            pending.commit()
    except BaseException:
        pending.abort()
        raise
    with contextlib.suppress(Exception):
        publish_committed(session, st.feed)
    return rec


@router.post(
    "/adapters/{adapter_id}/versions",
    status_code=201,
    response_model=VersionOut,
    openapi_extra=_UPLOAD_DOC,
    responses={502: {"model": ErrorOut, "description": "hf:// import: the hub is unreachable or failing"}},
)
async def upload_version(
    request: Request,
    adapter_id: str,
    who: Annotated[Principal, Depends(requires("version.upload", scope=OWNER_OF_ADAPTER))],
    quality_gate: Annotated[UploadQualityGate | None, Query(description=UPLOAD_GATE_DOC)] = None,
) -> JSONResponse:
    """Upload the files of a new version (multipart, every part named ``files``, the part's
    filename being the artifact name) or register one by reference (``{"source_uri": …}``).
    The version's quality gate starts ``skipped`` unless ``quality_gate=pending`` is given (query
    parameter, multipart text field or JSON field; if given twice the values must agree).
    201 with the version record; 422 ``invalid_adapter`` with ``details.problems``; 422
    ``invalid_request`` for a bad ``quality_gate``; 413 over the size cap. ``hf://`` imports:
    422 ``source_not_allowed`` outside the allow-list, 422 ``revision_not_found``, 502
    ``source_unavailable`` when the hub cannot be reached or fails."""
    st = state_of(request)
    actor = who.id
    base = await anyio.to_thread.run_sync(_lookup, st, adapter_id)
    if st.store is None:
        raise Unavailable("no artifact store is configured", code="storage_unavailable")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()

    gate_body: str | None = None
    if ctype == "multipart/form-data":
        result = await ingest.ingest_multipart(
            request,
            store=st.store,
            adapter_id=adapter_id,
            base=_spec(base),
            max_bytes=st.settings.max_adapter_bytes,
            fields={"quality_gate": check_upload_gate},
        )
        gate_body = result.fields.get("quality_gate")
    elif ctype == "application/json" or ctype.endswith("+json"):
        source = await _read_source_body(request)
        gate_body = source.quality_gate
        _gate(quality_gate, gate_body)  # refuse a conflict before copying anything
        result = await ingest.ingest_source(
            source.source_uri,
            allowed_sources=list(st.settings.allowed_sources),
            store=st.store,
            adapter_id=adapter_id,
            base=_spec(base),
            max_bytes=st.settings.max_adapter_bytes,
            hub=ingest.HubOptions.from_settings(st.settings),
        )
    else:
        raise InvalidRequest(
            'upload as multipart/form-data (parts named `files`) or JSON {"source_uri": …}',
            details={"content_type": ctype or None},
        )
    try:
        rec = await anyio.to_thread.run_sync(_record, st, adapter_id, result, actor, quality_gate, gate_body)
    except BaseException:  # _record aborts what it refuses; this is for never getting that far
        await ingest.abort_pending(result.pending)  # (the wait for a thread cancelled, …): idempotent
        raise
    return JSONResponse(status_code=201, content=VersionOut.model_validate(rec).model_dump(mode="json"))
