"""The routing snapshot (``registry.snapshot``): loaded whole, or changed by a few subjects.

``load_snapshot(session)`` reads everything in one read transaction and a fixed number of
queries (no N+1): revision, base models, adapters, versions, tenants, grants, live keys.

``apply_changes(session, base, subjects, revision)`` reads only the rows of the changed
subjects (``adapter:<id>`` → the adapter and its versions; ``owner:<name>`` → every owner's
limits; ``tenant:<id>`` → the tenant, its grants and live keys; ``base_model:<name>``) and
returns a new snapshot at ``revision`` that shares every other record with ``base`` (records
are frozen, so sharing is safe). It returns ``None`` when it cannot apply them — a ``*`` or a
subject kind the snapshot does not know, or a database behind ``revision`` — and the caller
reloads the whole snapshot instead. Each subject is re-read whole, so applying the same subject
twice, or a newer state than ``revision``, is harmless: the next change of that subject reads
it again.

On PostgreSQL the transaction is ``REPEATABLE READ`` when these functions open it, so every
query sees the same committed state; on SQLite every transaction is ``BEGIN IMMEDIATE``.

``load_snapshot_pg`` (blocking) and ``load_snapshot_pg_async`` (on an event loop, built in
slices of about 2 ms) read the whole snapshot in one statement on a psycopg connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any, TypeVar

import orjson
import psycopg
from sqlalchemy.orm import Session

from kit.ids import version_name
from registry.repositories import adapters as adapter_repo
from registry.repositories import base_models as base_repo
from registry.repositories import owners as owner_repo
from registry.repositories import routing as routing_repo
from registry.repositories import state as state_repo
from registry.repositories import tenants as tenant_repo
from registry.snapshot import (
    AdapterInfo,
    BaseModelInfo,
    FileInfo,
    GrantInfo,
    KeyInfo,
    Limits,
    RoutingSnapshot,
    TenantInfo,
    VersionInfo,
)

ADAPTER, TENANT, BASE_MODEL, OWNER = "adapter", "tenant", "base_model", "owner"
T = TypeVar("T")


def current_revision(session: Session) -> int:
    return state_repo.current_revision(session)


def _read_transaction(session: Session) -> None:
    if not session.in_transaction() and session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


def _base_model(b: Any) -> BaseModelInfo:
    return BaseModelInfo(
        name=b.name, hf_id=b.hf_id, max_lora_rank=b.max_lora_rank, target_modules=tuple(b.target_modules)
    )


def _adapters(rows: Iterable[Any], version_rows: Iterable[Any]) -> dict[str, AdapterInfo]:
    adapter_rows = list(rows)
    base_of = {a.id: a.base_model for a in adapter_rows}
    versions: dict[str, dict[str, VersionInfo]] = {a.id: {} for a in adapter_rows}
    for v in version_rows:
        name = version_name(v.number)
        versions.setdefault(v.adapter_id, {})[name] = VersionInfo(
            adapter_id=v.adapter_id,
            version=name,
            number=v.number,
            status=v.status,
            rank=v.rank,
            lora_alpha=float(v.lora_alpha),
            target_modules=tuple(v.target_modules),
            files=tuple(FileInfo(name=f["name"], size=int(f["size"]), sha256=f["sha256"]) for f in v.files),
            storage_uri=v.storage_uri,
            base_model=base_of.get(v.adapter_id, ""),
            rollback_to=version_name(v.rollback_to) if v.rollback_to is not None else None,
            int_id=int(v.id),
        )
    return {
        a.id: AdapterInfo(
            id=a.id,
            base_model=a.base_model,
            status=a.status,
            active_version=version_name(a.active_version) if a.active_version is not None else None,
            canary_version=version_name(a.canary_version) if a.canary_version is not None else None,
            canary_weight=a.canary_weight if a.canary_version is not None else None,
            versions=versions.get(a.id, {}),
            hot=bool(a.hot),
            owner=a.owner,
            limits=Limits(rpm=a.rpm, tpm=a.tpm, max_concurrency=a.max_concurrency),
            on_load_failure=a.on_load_failure or "error",
        )
        for a in adapter_rows
    }


def _owners(rows: Iterable[Any]) -> dict[str, Limits]:
    return {o.name: Limits(rpm=o.rpm, tpm=o.tpm, max_concurrency=o.max_concurrency) for o in rows}


def _tenants(rows: Iterable[Any], grant_rows: Iterable[Any]) -> dict[str, TenantInfo]:
    grants: dict[str, dict[str, GrantInfo]] = {}
    for g in grant_rows:
        grants.setdefault(g.tenant_id, {})[g.adapter_id] = GrantInfo(
            adapter_id=g.adapter_id, rpm=g.rpm, tpm=g.tpm
        )
    return {
        t.id: TenantInfo(
            id=t.id,
            name=t.name,
            limits=Limits(rpm=t.rpm, tpm=t.tpm, max_concurrency=t.max_concurrency),
            base_model_access=bool(t.base_model_access),
            grants=grants.get(t.id, {}),
            max_cold_waiters=t.max_cold_waiters,
        )
        for t in rows
    }


def _key(k: Any) -> KeyInfo:
    return KeyInfo(key_id=k.key_id, tenant_id=k.tenant_id, prefix=k.prefix, key_hash=k.key_hash)


def load_snapshot(session: Session) -> RoutingSnapshot:
    _read_transaction(session)
    revision = state_repo.current_revision(session)
    base_models = {b.name: _base_model(b) for b in base_repo.all_rows(session)}
    adapters = _adapters(adapter_repo.all_rows(session), adapter_repo.all_versions(session))
    tenants = _tenants(tenant_repo.all_rows(session), tenant_repo.all_grants(session))
    by_prefix: dict[str, list[KeyInfo]] = {}
    for k in tenant_repo.live_keys(session):
        by_prefix.setdefault(k.prefix, []).append(_key(k))
    return RoutingSnapshot(
        revision=revision,
        base_models=base_models,
        adapters=adapters,
        tenants=tenants,
        keys_by_prefix={p: tuple(ks) for p, ks in by_prefix.items()},
        owners=_owners(owner_repo.all_rows(session)),
    )


def load_snapshot_pg(conn: psycopg.Connection[Any]) -> RoutingSnapshot:
    """``load_snapshot`` in one statement on a psycopg connection (PostgreSQL): the database
    serialises the rows, so a gateway spends about half the CPU of reading them through the ORM."""
    rows = routing_repo.all_rows_pg(conn)
    by_prefix: dict[str, list[KeyInfo]] = {}
    for k in rows.live_keys:
        by_prefix.setdefault(k.prefix, []).append(_key(k))
    return RoutingSnapshot(
        revision=rows.revision,
        base_models={b.name: _base_model(b) for b in rows.base_models},
        adapters=_adapters(rows.adapters, rows.versions),
        tenants=_tenants(rows.tenants, rows.grants),
        keys_by_prefix={p: tuple(ks) for p, ks in by_prefix.items()},
        owners=_owners(rows.owners),
    )


SLICE_ROWS = 100  # records built between two looks at the clock (``load_snapshot_pg_async``)


class _Pacer:
    """Yields to the event loop whenever ``slice_s`` of work went by since the last yield."""

    def __init__(self, slice_s: float) -> None:
        self._slice_s = slice_s
        self._since = time.perf_counter()
        self.yields = 0

    async def __call__(self) -> None:
        if time.perf_counter() - self._since >= self._slice_s:
            await asyncio.sleep(0)
            self.yields += 1
            self._since = time.perf_counter()


def _slices(rows: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for i in range(0, len(rows), SLICE_ROWS):
        yield rows[i : i + SLICE_ROWS]


def _grouped(rows: list[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r[key], []).append(r)
    return out


def _ns(rows: Iterable[dict[str, Any]]) -> list[SimpleNamespace]:
    return [SimpleNamespace(**r) for r in rows]


async def load_snapshot_pg_async(
    conn: psycopg.AsyncConnection[Any], *, slice_s: float = 0.002
) -> RoutingSnapshot:
    """``load_snapshot_pg`` for an event loop: the same statement with every table as JSON text
    (nothing parsed while the rows arrive), each table parsed by orjson, and the records built
    ``SLICE_ROWS`` at a time, yielding to the loop whenever ``slice_s`` of work went by. A whole
    load of a large registry then interleaves with the requests it serves instead of holding
    the GIL on a thread (where each of the loop's socket calls waits for it again)."""
    revision, texts = await routing_repo.all_rows_pg_text(conn)
    return await snapshot_from_json(revision, texts, slice_s=slice_s)


async def snapshot_from_json(revision: int, texts: list[str], *, slice_s: float = 0.002) -> RoutingSnapshot:
    """The snapshot from ``all_rows_pg_text``'s tables, built in slices (``load_snapshot_pg_async``)."""
    pace = _Pacer(slice_s)
    tables: list[list[dict[str, Any]]] = []
    for text in texts:
        tables.append(orjson.loads(text))
        await pace()
    base_rows, adapter_rows, version_rows, tenant_rows, grant_rows, key_rows, owner_rows = tables
    versions_of = _grouped(version_rows, "adapter_id")
    await pace()
    adapters: dict[str, AdapterInfo] = {}
    for chunk in _slices(adapter_rows):
        vs = _ns(v for a in chunk for v in versions_of.get(a["id"], ()))
        adapters.update(_adapters(_ns(chunk), vs))
        await pace()
    grants_of = _grouped(grant_rows, "tenant_id")
    tenants: dict[str, TenantInfo] = {}
    for chunk in _slices(tenant_rows):
        tenants.update(_tenants(_ns(chunk), _ns(g for t in chunk for g in grants_of.get(t["id"], ()))))
        await pace()
    by_prefix: dict[str, list[KeyInfo]] = {}
    for chunk in _slices(key_rows):
        for k in _ns(chunk):
            by_prefix.setdefault(k.prefix, []).append(_key(k))
        await pace()
    return RoutingSnapshot(
        revision=revision,
        base_models={b.name: _base_model(b) for b in _ns(base_rows)},
        adapters=adapters,
        tenants=tenants,
        keys_by_prefix={p: tuple(ks) for p, ks in by_prefix.items()},
        owners=_owners(_ns(owner_rows)),
    )


def split_subjects(subjects: Iterable[str]) -> dict[str, list[str]] | None:
    """``{"adapter": [ids…], "tenant": […], "base_model": […]}``, or None if any needs a full load."""
    out: dict[str, list[str]] = {ADAPTER: [], TENANT: [], BASE_MODEL: [], OWNER: []}
    for s in subjects:
        kind, sep, ident = s.partition(":")
        if not sep or kind not in out or not ident:
            return None
        out[kind].append(ident)
    return out


def apply_changes(
    session: Session, base: RoutingSnapshot, subjects: Iterable[str], revision: int
) -> RoutingSnapshot | None:
    """``base`` with ``subjects`` re-read, at ``revision``; None: reload the whole snapshot instead."""
    parts = split_subjects(subjects)
    if parts is None:
        return None
    _read_transaction(session)
    adapters, tenants, names = parts[ADAPTER], parts[TENANT], parts[BASE_MODEL]
    rows = routing_repo.SubjectRows(
        revision=state_repo.current_revision(session),
        base_models=routing_repo.base_models(session, names) if names else [],
        adapters=routing_repo.adapters(session, adapters) if adapters else [],
        versions=routing_repo.versions(session, adapters) if adapters else [],
        tenants=routing_repo.tenants(session, tenants) if tenants else [],
        grants=routing_repo.grants(session, tenants) if tenants else [],
        live_keys=routing_repo.live_keys(session, tenants) if tenants else [],
        # owners: few rows, all re-read on any owner change (an owner name may hold spaces,
        # which the notice's subject list cannot carry whole)
        owners=owner_repo.all_rows(session) if parts[OWNER] else [],
    )
    return with_rows(base, parts, rows, revision)


async def apply_changes_pg(
    conn: psycopg.AsyncConnection[Any], base: RoutingSnapshot, subjects: Iterable[str], revision: int
) -> RoutingSnapshot | None:
    """``apply_changes`` on an async psycopg connection (PostgreSQL): one statement, one round trip."""
    parts = split_subjects(subjects)
    if parts is None:
        return None
    rows = await routing_repo.subject_rows_pg(
        conn,
        adapters=parts[ADAPTER],
        tenants=parts[TENANT],
        base_models=parts[BASE_MODEL],
        owners=bool(parts[OWNER]),
    )
    return with_rows(base, parts, rows, revision)


def with_rows(
    base: RoutingSnapshot, parts: dict[str, list[str]], rows: routing_repo.SubjectRows, revision: int
) -> RoutingSnapshot | None:
    """``base`` with the subjects of ``parts`` replaced by ``rows`` (absent rows: removed)."""
    if rows.revision < revision:
        return None  # a notice from a database we do not read: never trust it
    base_models = base.base_models
    if parts[BASE_MODEL]:
        fresh_models = {b.name: _base_model(b) for b in rows.base_models}
        base_models = _replace(base_models, parts[BASE_MODEL], fresh_models)
    adapters = base.adapters
    if parts[ADAPTER]:
        adapters = _replace(adapters, parts[ADAPTER], _adapters(rows.adapters, rows.versions))
    tenants, keys_by_prefix = base.tenants, base.keys_by_prefix
    if parts[TENANT]:
        tenants = _replace(tenants, parts[TENANT], _tenants(rows.tenants, rows.grants))
        keys_by_prefix = _replace_keys(keys_by_prefix, set(parts[TENANT]), rows.live_keys)
    owners = _owners(rows.owners) if parts[OWNER] else base.owners
    return RoutingSnapshot(
        revision=revision,
        base_models=base_models,
        adapters=adapters,
        tenants=tenants,
        keys_by_prefix=keys_by_prefix,
        owners=owners,
    )


def _replace(old: dict[str, T], ids: Iterable[str], fresh: dict[str, T]) -> dict[str, T]:
    """A copy of ``old`` where each of ``ids`` is ``fresh[id]``, or gone if the row is gone."""
    out = dict(old)
    for i in ids:
        if i in fresh:
            out[i] = fresh[i]
        else:
            out.pop(i, None)
    return out


def _replace_keys(
    old: dict[str, tuple[KeyInfo, ...]], tenant_ids: set[str], live: Iterable[Any]
) -> dict[str, tuple[KeyInfo, ...]]:
    """``old`` with every key of ``tenant_ids`` replaced by their live keys (order: key id)."""
    out = dict(old)
    for prefix, keys in old.items():
        if any(k.tenant_id in tenant_ids for k in keys):
            kept = tuple(k for k in keys if k.tenant_id not in tenant_ids)
            if kept:
                out[prefix] = kept
            else:
                del out[prefix]
    for row in live:
        out[row.prefix] = tuple(sorted((*out.get(row.prefix, ()), _key(row)), key=lambda k: k.key_id))
    return out
