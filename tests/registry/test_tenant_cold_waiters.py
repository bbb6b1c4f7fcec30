"""The tenant limit ``max_cold_waiters`` (SPEC §15) in the registry, on SQLite and PostgreSQL:
set on create, merged on PATCH, cleared with null, audited, refused with 422 when it is not an
integer from 0 to 2**31-1, carried by the routing snapshot (every loader a gateway uses), and
not a limit of adapters or owners."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from kit.db import session_scope
from kit.errors import InvalidRequest
from registry.feed import libpq_dsn
from registry.services import tenants as svc
from registry.services.snapshot import apply_changes, apply_changes_pg, load_snapshot, load_snapshot_pg
from registry.snapshot import Limits, RoutingSnapshot
from tests.registry.core_support import seed_adapter

V1 = "/admin/v1"
T = f"{V1}/tenants/acme"
UNLIMITED = {"rpm": None, "tpm": None, "max_concurrency": None, "max_cold_waiters": None}
BAD_VALUES: list[Any] = [-1, 2**31, 2**40, "2", "two", True, 1.5, [2], {"n": 2}]


def _events(c: TestClient, action: str) -> list[dict[str, Any]]:
    return list(c.get(f"{V1}/audit", params={"action": action, "limit": 500}).json()["data"])


def _refused(r: Any) -> None:
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_request" and r.json()["error"]["message"]


def test_create_patch_clear_and_audit(client: TestClient) -> None:
    r = client.post(f"{V1}/tenants", json={"id": "acme", "limits": {"rpm": 60, "max_cold_waiters": 2}})
    assert r.status_code == 201, r.text
    assert r.json()["limits"] == {**UNLIMITED, "rpm": 60, "max_cold_waiters": 2}
    assert client.get(T).json()["limits"]["max_cold_waiters"] == 2
    listed = {t["id"]: t["limits"] for t in client.get(f"{V1}/tenants").json()["data"]}
    assert listed["acme"]["max_cold_waiters"] == 2
    created = _events(client, "tenant.created")
    assert created[0]["details"]["limits"]["max_cold_waiters"] == 2
    # merged key by key: other limits stay
    r = client.patch(T, json={"limits": {"max_cold_waiters": 5}})
    assert r.status_code == 200, r.text
    assert r.json()["limits"] == {**UNLIMITED, "rpm": 60, "max_cold_waiters": 5}
    r = client.patch(T, json={"limits": {"rpm": 10}})
    assert r.json()["limits"]["max_cold_waiters"] == 5
    # 0 is a limit (no request may wait), null clears it
    assert client.patch(T, json={"limits": {"max_cold_waiters": 0}}).json()["limits"]["max_cold_waiters"] == 0
    r = client.patch(T, json={"limits": {"max_cold_waiters": None}})
    assert r.json()["limits"] == {**UNLIMITED, "rpm": 10}
    updated = [e["details"] for e in _events(client, "tenant.updated")]
    assert {"limits": {"max_cold_waiters": 5}} in updated
    assert {"limits": {"max_cold_waiters": None}} in updated
    assert all(e["subject_type"] == "tenant" for e in _events(client, "tenant.updated"))
    # a tenant created without it is unlimited
    r = client.post(f"{V1}/tenants", json={"id": "zeta"})
    assert r.json()["limits"] == UNLIMITED


@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_bad_values_are_422_on_create_and_patch(client: TestClient, value: Any) -> None:
    _refused(client.post(f"{V1}/tenants", json={"id": "acme", "limits": {"max_cold_waiters": value}}))
    assert client.get(T).status_code == 404  # nothing was created
    r = client.post(f"{V1}/tenants", json={"id": "acme", "limits": {"max_cold_waiters": 3}})
    assert r.status_code == 201
    _refused(client.patch(T, json={"limits": {"max_cold_waiters": value}}))
    assert client.get(T).json()["limits"]["max_cold_waiters"] == 3  # unchanged


def test_service_checks_the_range_itself(client: TestClient, factory: Any) -> None:
    """Callers of the service besides the API (the CLI's db commands, tests) get the same rule."""
    assert client.post(f"{V1}/tenants", json={"id": "acme"}).status_code == 201
    for value in (-1, 2**31, 2**40, "2", True):
        with pytest.raises(InvalidRequest), session_scope(factory) as s:
            svc.update_tenant(s, "acme", {"limits": {"max_cold_waiters": value}}, actor="t")
        with pytest.raises(InvalidRequest), session_scope(factory) as s:
            svc.create_tenant(
                s, tenant_id="t2", name=None, limits={"max_cold_waiters": value}, base_model_access=False,
                actor="t",
            )  # fmt: skip
    with session_scope(factory) as s:
        rec = svc.update_tenant(s, "acme", {"limits": {"max_cold_waiters": 2**31 - 1}}, actor="t")
    assert rec.limits.max_cold_waiters == 2**31 - 1


def test_adapter_and_owner_limits_do_not_take_it(client: TestClient) -> None:
    seed_adapter(client)
    _refused(client.patch(f"{V1}/adapters/support", json={"limits": {"max_cold_waiters": 2}}))
    _refused(client.put(f"{V1}/owners/team-a/limits", json={"max_cold_waiters": 2}))
    assert set(client.get(f"{V1}/adapters/support").json()["limits"]) == {"rpm", "tpm", "max_concurrency"}
    assert set(client.get(f"{V1}/owners/team-a").json()["limits"]) == {"rpm", "tpm", "max_concurrency"}


def _pg_snapshots(url: str, base: RoutingSnapshot, revision: int) -> list[RoutingSnapshot]:
    """The whole load and the change apply a PostgreSQL gateway uses (one statement each)."""
    with psycopg.connect(libpq_dsn(url)) as conn:
        whole = load_snapshot_pg(conn)

    async def applied() -> RoutingSnapshot | None:
        async with await psycopg.AsyncConnection.connect(libpq_dsn(url), autocommit=True) as aconn:
            return await apply_changes_pg(aconn, base, {"tenant:acme"}, revision)

    inc = asyncio.run(applied())
    assert inc is not None
    return [whole, inc]


def test_snapshot_carries_it_whole_and_by_change(client: TestClient, factory: Any, db_url: str) -> None:
    assert client.post(f"{V1}/tenants", json={"id": "acme", "limits": {"rpm": 7}}).status_code == 201
    with session_scope(factory) as s:
        base = load_snapshot(s)
    assert base.tenants["acme"].max_cold_waiters is None
    assert client.patch(T, json={"limits": {"max_cold_waiters": 2}}).status_code == 200
    with session_scope(factory) as s:
        revision = load_snapshot(s).revision
    snaps: list[RoutingSnapshot] = []
    with session_scope(factory) as s:
        snaps.append(load_snapshot(s))
    with session_scope(factory) as s:
        inc = apply_changes(s, base, {"tenant:acme"}, revision)
    assert inc is not None
    snaps.append(inc)
    if db_url.startswith("postgresql"):
        snaps += _pg_snapshots(db_url, base, revision)
    for snap in snaps:
        t = snap.tenants["acme"]
        assert t.max_cold_waiters == 2 and t.limits == Limits(rpm=7), snap
