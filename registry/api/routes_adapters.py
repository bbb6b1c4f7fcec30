"""Routes: base models, adapters, versions (list/describe), promote / rollback / kill switches."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from kit.errors import InvalidRequest
from registry.api.deps import read, state_of, write
from registry.api.schemas import (
    AdapterCreate,
    AdapterDetailOut,
    AdapterOut,
    AdapterPage,
    AdapterPatch,
    BaseModelCreate,
    BaseModelOut,
    BaseModelPage,
    BaseModelPatch,
    PromoteBody,
    QualityGateBody,
    VersionOut,
    VersionPage,
)
from registry.api.schemas_gov import PromotionOut
from registry.api.scopes import ADAPTER_AND_NEW_OWNER, NEW_ADAPTER_OWNER, OWNER_OF_ADAPTER
from registry.auth import Principal
from registry.auth.dependencies import requires
from registry.services import adapters as adapter_svc
from registry.services import base_models as base_svc
from registry.services import gates, lifecycle
from registry.services import promotions as promo_svc

router = APIRouter()

Limit = Annotated[int | None, Query(description="Page size (default 50, at most 500).")]
Cursor = Annotated[str | None, Query(description="Opaque cursor from the previous page's next_cursor.")]
Reader = Annotated[Principal, Depends(requires("read"))]


def _on_adapter(permission: str) -> Any:
    """``who`` of a route that acts on the adapter in its path (scope: the adapter's owner)."""
    return Depends(requires(permission, scope=OWNER_OF_ADAPTER))


# --------------------------------------------------------------------------- base models


@router.post("/base-models", status_code=201, response_model=BaseModelOut, tags=["base models"])
def create_base_model(
    request: Request, body: BaseModelCreate, who: Annotated[Principal, Depends(requires("base_model.write"))]
) -> BaseModelOut:
    spec = body.model_dump()
    rec = write(state_of(request), lambda s: base_svc.create_base_model(s, spec, actor=who.id))
    return BaseModelOut.model_validate(rec)


@router.get("/base-models", response_model=BaseModelPage, tags=["base models"])
def list_base_models(
    request: Request, who: Reader, limit: Limit = None, cursor: Cursor = None
) -> BaseModelPage:
    page = read(state_of(request), lambda s: base_svc.list_base_models(s, limit=limit, cursor=cursor))
    return BaseModelPage(
        data=[BaseModelOut.model_validate(r) for r in page.data], next_cursor=page.next_cursor
    )


@router.get("/base-models/{name}", response_model=BaseModelOut, tags=["base models"])
def get_base_model(request: Request, name: str, who: Reader) -> BaseModelOut:
    adapter_svc.require_slug(name, "name")
    return BaseModelOut.model_validate(read(state_of(request), lambda s: base_svc.get_base_model(s, name)))


@router.patch("/base-models/{name}", response_model=BaseModelOut, tags=["base models"])
def update_base_model(
    request: Request,
    name: str,
    body: BaseModelPatch,
    who: Annotated[Principal, Depends(requires("base_model.write"))],
) -> BaseModelOut:
    """Change ``approvals_required`` (the default of the base model's adapters, SPEC §14)."""
    changes: dict[str, Any] = {f: getattr(body, f) for f in body.model_fields_set}
    rec = write(state_of(request), lambda s: base_svc.update_base_model(s, name, changes, actor=who.id))
    return BaseModelOut.model_validate(rec)


# --------------------------------------------------------------------------- adapters


@router.post("/adapters", status_code=201, response_model=AdapterOut, tags=["adapters"])
def create_adapter(
    request: Request,
    body: AdapterCreate,
    who: Annotated[Principal, Depends(requires("adapter.create", scope=NEW_ADAPTER_OWNER))],
) -> AdapterOut:
    rec = write(
        state_of(request),
        lambda s: adapter_svc.create_adapter(
            s,
            adapter_id=body.id,
            base_model=body.base_model,
            owner=body.owner,
            description=body.description,
            hot=body.hot,
            on_load_failure=body.on_load_failure,
            actor=who.id,
        ),
    )
    return AdapterOut.model_validate(rec)


@router.patch("/adapters/{adapter_id}", response_model=AdapterOut, tags=["adapters"])
def update_adapter(
    request: Request,
    adapter_id: str,
    body: AdapterPatch,
    who: Annotated[
        Principal,
        Depends(
            requires(
                "adapter.update",
                scope=ADAPTER_AND_NEW_OWNER,
                fields={"approvals_required": "adapter.approvals"},
            )
        ),
    ],
) -> AdapterOut:
    """Change any of ``description``, ``owner`` (null clears them), ``hot`` (a marked-hot
    adapter's active version is kept prewarmed by the router) and ``limits`` (``rpm``, ``tpm``,
    ``max_concurrency`` shared by every tenant; merged key by key, null clears all three). Fields
    left out stay as they are; a real change writes one ``adapter.updated`` audit event and bumps
    the registry revision."""
    changes: dict[str, Any] = {f: getattr(body, f) for f in body.model_fields_set}
    if body.limits is not None:
        changes["limits"] = {k: getattr(body.limits, k) for k in body.limits.model_fields_set}
    if "hot" in changes and changes["hot"] is None:
        raise InvalidRequest("hot cannot be null", details={"field": "hot"})
    rec = write(state_of(request), lambda s: adapter_svc.update_adapter(s, adapter_id, changes, actor=who.id))
    return AdapterOut.model_validate(rec)


@router.get("/adapters", response_model=AdapterPage, tags=["adapters"])
def list_adapters(
    request: Request,
    who: Reader,
    limit: Limit = None,
    cursor: Cursor = None,
    base_model: str | None = None,
    owner: str | None = None,
    status: str | None = None,
) -> AdapterPage:
    page = read(
        state_of(request),
        lambda s: adapter_svc.list_adapters(
            s, limit=limit, cursor=cursor, base_model=base_model, owner=owner, status=status
        ),
    )
    return AdapterPage(data=[AdapterOut.model_validate(r) for r in page.data], next_cursor=page.next_cursor)


@router.get("/adapters/{adapter_id}", response_model=AdapterDetailOut, tags=["adapters"])
def describe_adapter(request: Request, adapter_id: str, who: Reader) -> AdapterDetailOut:
    rec = read(state_of(request), lambda s: adapter_svc.describe_adapter(s, adapter_id))
    return AdapterDetailOut.model_validate(rec)


@router.get("/adapters/{adapter_id}/versions", response_model=VersionPage, tags=["versions"])
def list_versions(
    request: Request, adapter_id: str, who: Reader, limit: Limit = None, cursor: Cursor = None
) -> VersionPage:
    page = read(
        state_of(request), lambda s: adapter_svc.list_versions(s, adapter_id, limit=limit, cursor=cursor)
    )
    return VersionPage(data=[VersionOut.model_validate(r) for r in page.data], next_cursor=page.next_cursor)


@router.get("/adapters/{adapter_id}/versions/{version}", response_model=VersionOut, tags=["versions"])
def get_version(request: Request, adapter_id: str, version: str, who: Reader) -> VersionOut:
    rec = read(state_of(request), lambda s: adapter_svc.get_version(s, adapter_id, version))
    return VersionOut.model_validate(rec)


# --------------------------------------------------------------------------- state changes


@router.post(
    "/adapters/{adapter_id}/versions/{version}/promote",
    response_model=AdapterDetailOut,
    responses={202: {"model": PromotionOut, "description": "approvals are required: a promotion request"}},
    tags=["lifecycle"],
)
def promote(
    request: Request,
    adapter_id: str,
    version: str,
    who: Annotated[
        Principal,
        Depends(
            requires("adapter.promote", scope=OWNER_OF_ADAPTER, flags={"force": "adapter.force_promote"})
        ),
    ],
    body: Annotated[PromoteBody | None, Body()] = None,
) -> Any:
    """Make ``version`` active, or with ``canary_weight`` (1–99) the canary with that share.

    A version whose quality gate is ``pending`` or ``failed`` is refused with 409
    ``quality_gate_pending`` / ``quality_gate_failed`` unless ``force`` is true (the
    ``version.promoted`` / ``version.canary`` event then records ``forced_quality_gate``).
    ``force: true`` needs the permission ``adapter.force_promote`` (admin), whatever the gate.

    When the adapter's ``approvals_required`` (or its base model's) is above 0, nothing changes
    yet: 202 with a ``pending`` promotion request (SPEC §14) that shows ``force`` and what it was
    made against (``seen``), executed once approved."""
    weight = body.canary_weight if body is not None else None
    force = body.force if body is not None else False
    st = state_of(request)
    out = write(
        st,
        lambda s: promo_svc.promote_or_request(
            s,
            adapter_id,
            version,
            canary_weight=weight,
            force=force,
            actor=who.id,
            ttl_s=st.settings.promotion_ttl_s,
        ),
    )
    if out.promotion is not None:
        content = jsonable_encoder(PromotionOut.model_validate(out.promotion))
        return JSONResponse(status_code=202, content=content)
    return AdapterDetailOut.model_validate(out.adapter)


@router.post(
    "/adapters/{adapter_id}/versions/{version}/quality-gate", response_model=VersionOut, tags=["versions"]
)
def set_quality_gate(
    request: Request,
    adapter_id: str,
    version: str,
    body: QualityGateBody,
    who: Annotated[Principal, _on_adapter("version.quality_gate")],
) -> VersionOut:
    """Record a version's quality-gate result (e.g. from CI after an eval run): ``status`` and
    optional ``details`` (a JSON object such as eval scores; it replaces the previous details).
    One transaction with a ``version.quality_gate`` audit event (``details``: version, from, to,
    details); a call that changes nothing writes nothing. Disabled versions can be recorded too.
    ``pending`` and ``failed`` block promotion; ``passed`` and ``skipped`` allow it."""
    rec = write(
        state_of(request),
        lambda s: gates.set_quality_gate(s, adapter_id, version, body.status, body.details, actor=who.id),
    )
    return VersionOut.model_validate(rec)


@router.post("/adapters/{adapter_id}/rollback", response_model=AdapterDetailOut, tags=["lifecycle"])
def rollback(
    request: Request, adapter_id: str, who: Annotated[Principal, _on_adapter("adapter.rollback")]
) -> AdapterDetailOut:
    """While a canary runs: the canary is dropped and the active version kept. Otherwise the
    active version's ``rollback_to`` becomes active again (disabled ones skipped); 409
    ``no_rollback_target`` when there is none."""
    rec = write(state_of(request), lambda s: lifecycle.rollback(s, adapter_id, actor=who.id))
    return AdapterDetailOut.model_validate(rec)


@router.delete("/adapters/{adapter_id}/canary", response_model=AdapterDetailOut, tags=["lifecycle"])
def end_canary(
    request: Request, adapter_id: str, who: Annotated[Principal, _on_adapter("adapter.rollback")]
) -> AdapterDetailOut:
    """End the canary: its version goes back to ``ready`` and all traffic to the active version,
    which stays as it is (audit ``version.canary_cleared``). With no canary nothing changes: 200
    all the same."""
    rec = write(state_of(request), lambda s: lifecycle.end_canary(s, adapter_id, actor=who.id))
    return AdapterDetailOut.model_validate(rec)


@router.post("/adapters/{adapter_id}/disable", response_model=AdapterDetailOut, tags=["lifecycle"])
def disable_adapter(
    request: Request, adapter_id: str, who: Annotated[Principal, _on_adapter("adapter.disable")]
) -> AdapterDetailOut:
    """Kill switch: every request for the adapter fails fast; replicas unload it."""
    rec = write(
        state_of(request),
        lambda s: lifecycle.set_adapter_enabled(s, adapter_id, False, actor=who.id),
    )
    return AdapterDetailOut.model_validate(rec)


@router.post("/adapters/{adapter_id}/enable", response_model=AdapterDetailOut, tags=["lifecycle"])
def enable_adapter(
    request: Request, adapter_id: str, who: Annotated[Principal, _on_adapter("adapter.enable")]
) -> AdapterDetailOut:
    """Undo the kill switch: the previous active/canary state is served again."""
    rec = write(state_of(request), lambda s: lifecycle.set_adapter_enabled(s, adapter_id, True, actor=who.id))
    return AdapterDetailOut.model_validate(rec)


@router.post(
    "/adapters/{adapter_id}/versions/{version}/disable", response_model=AdapterDetailOut, tags=["lifecycle"]
)
def disable_version(
    request: Request,
    adapter_id: str,
    version: str,
    who: Annotated[Principal, _on_adapter("version.disable")],
) -> AdapterDetailOut:
    """Block one version; disabling the active version rolls back when it can."""
    rec = write(state_of(request), lambda s: lifecycle.disable_version(s, adapter_id, version, actor=who.id))
    return AdapterDetailOut.model_validate(rec)


@router.post(
    "/adapters/{adapter_id}/versions/{version}/enable", response_model=AdapterDetailOut, tags=["lifecycle"]
)
def enable_version(
    request: Request,
    adapter_id: str,
    version: str,
    who: Annotated[Principal, _on_adapter("version.enable")],
) -> AdapterDetailOut:
    """Undo a version's disable: it goes back to ``ready`` (promotable again; its quality gate as
    it was). 409 ``conflict`` when the version is not disabled."""
    rec = write(state_of(request), lambda s: lifecycle.enable_version(s, adapter_id, version, actor=who.id))
    return AdapterDetailOut.model_validate(rec)
