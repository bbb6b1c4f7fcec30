"""Client model string → what serves it (SPEC §2, §13).

- ``BASE`` — the base model itself, when the tenant has ``base_model_access``.
- ``BASE:ADAPTER`` — the adapter's active version, or its canary with ``canary_weight`` percent
  of traffic: chosen per request at random, or sticky per ``(tenant, user)`` when the body has
  OpenAI's ``user`` (a hash, so every gateway process picks the same side).
- ``BASE:ADAPTER@vN`` — that version, whatever the active one is, unless it is disabled.

A tenant needs a grant for an adapter. Unknown and not-granted models give the same 404
``model_not_found`` (no existence leak); a granted disabled adapter gives 403
``adapter_disabled``; a pinned disabled version 403 ``version_disabled``; an adapter with no
active version is 404 as ``BASE:ADAPTER``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import GatewayError, model_not_found
from registry.snapshot import AdapterInfo, GrantInfo, RoutingSnapshot, TenantInfo, VersionInfo


@dataclass(frozen=True, slots=True)
class Resolution:
    base_model: str
    adapter: AdapterInfo | None  # None → the bare base model
    version: VersionInfo | None
    grant: GrantInfo | None
    canary: bool = False
    pinned: bool = False  # BASE:ADAPTER@vN: served as asked or not at all (no fallback)


def split_model(model: str) -> tuple[str, str | None, str | None]:
    """Split a model string: ``"b:a@v2"`` → ``("b", "a", "v2")``, ``"b"`` → ``("b", None, None)``."""
    base, sep, rest = model.partition(":")
    if not sep:
        return base, None, None
    adapter, at, version = rest.partition("@")
    return base, adapter, (version if at else None)


def canary_bucket(tenant_id: str, user: str, adapter_id: str) -> int:
    """Stable bucket 0–99 for sticky canary assignment (same in every gateway process)."""
    digest = hashlib.blake2b(f"{tenant_id}\x00{user}\x00{adapter_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 100


def resolve(
    snapshot: RoutingSnapshot,
    tenant: TenantInfo,
    model: str,
    *,
    user: str | None = None,
    rand: Callable[[], float] = random.random,
) -> Resolution:
    """Resolve ``model`` for ``tenant``; raise 404/403 :class:`GatewayError` as SPEC §13 says."""
    base, adapter_id, version_name = split_model(model)
    if base not in snapshot.base_models:
        raise model_not_found(model)
    if adapter_id is None:
        if not tenant.base_model_access:
            raise model_not_found(model)
        return Resolution(base_model=base, adapter=None, version=None, grant=None)
    grant = tenant.grants.get(adapter_id)
    adapter = snapshot.adapters.get(adapter_id)
    if grant is None or adapter is None or adapter.base_model != base:
        raise model_not_found(model)
    if adapter.status == "disabled":
        raise GatewayError(403, "adapter_disabled", f"The adapter `{adapter_id}` is disabled.", param="model")
    if version_name is not None:
        version = adapter.versions.get(version_name)
        if version is None:
            raise model_not_found(model)
        if version.status == "disabled":
            raise GatewayError(
                403,
                "version_disabled",
                f"Version `{version_name}` of the adapter `{adapter_id}` is disabled.",
                param="model",
            )
        return Resolution(base_model=base, adapter=adapter, version=version, grant=grant, pinned=True)
    if adapter.active_version is None or adapter.active_version not in adapter.versions:
        raise model_not_found(model)
    chosen = adapter.active_version
    canary = False
    cv, weight = adapter.canary_version, adapter.canary_weight
    if cv is not None and weight and cv in adapter.versions and adapter.versions[cv].status != "disabled":
        point = canary_bucket(tenant.id, user, adapter_id) if user else int(rand() * 100)
        if point < weight:
            chosen, canary = cv, True
    return Resolution(
        base_model=base, adapter=adapter, version=adapter.versions[chosen], grant=grant, canary=canary
    )
