"""Admin API surface: auth, envelopes, 422/404 shapes, pagination, tenants, keys, grants, audit,
replicas/prewarm delegation, OpenAPI — on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from registry.demo import demo_base_model
from registry.keys import hash_key, key_prefix
from tests.registry.core_support import (
    TOKEN,
    add_versions,
    make_settings,
    seed_adapter,
)

V1 = "/admin/v1"


def _envelope(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


def test_auth_no_token_wrong_token_tenant_key(client: TestClient) -> None:
    seed_adapter(client)
    client.post(f"{V1}/tenants", json={"id": "acme"})
    tenant_key = client.post(f"{V1}/tenants/acme/keys").json()["key"]
    for headers in (
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {tenant_key}"},
    ):
        for method, path in (
            ("get", "/adapters"),
            ("post", "/tenants"),
            ("get", "/audit"),
            ("get", "/replicas"),
        ):
            r = client.request(method, f"{V1}{path}", headers=headers, json={"id": "x"})
            _envelope(r, 401, "unauthorized")
    # the right token works; healthz and the OpenAPI document need none
    assert client.get(f"{V1}/adapters").status_code == 200
    anon = TestClient(client.app)
    assert anon.get(f"{V1}/healthz").json() == {"status": "ok"}
    doc = anon.get(f"{V1}/openapi.json").json()
    paths = doc["paths"]
    for p in (
        "/admin/v1/base-models",
        "/admin/v1/adapters/{adapter_id}/versions",
        "/admin/v1/adapters/{adapter_id}/versions/{version}/promote",
        "/admin/v1/adapters/{adapter_id}/rollback",
        "/admin/v1/tenants/{tenant_id}/grants/{adapter_id}",
        "/admin/v1/tenants/{tenant_id}/keys/{key_id}",
        "/admin/v1/replicas",
        "/admin/v1/adapters/{adapter_id}/prewarm",
        "/admin/v1/audit",
    ):
        assert p in paths, p
    upload = paths["/admin/v1/adapters/{adapter_id}/versions"]["post"]["requestBody"]["content"]
    assert "multipart/form-data" in upload and "application/json" in upload


def test_admin_api_without_configured_token_refuses_everything(
    tmp_path: Any, db_url: str, engine: Any
) -> None:
    from registry.api import create_admin_app

    settings = make_settings(tmp_path, db_url)
    settings.admin_token = None
    c = TestClient(create_admin_app(settings, engine=engine))
    _envelope(c.get(f"{V1}/adapters", headers={"Authorization": "Bearer anything"}), 401, "unauthorized")


def test_request_errors_are_422_invalid_request(client: TestClient) -> None:
    seed_adapter(client)
    # not JSON
    r = client.post(f"{V1}/adapters", content=b"{nope", headers={"content-type": "application/json"})
    assert _envelope(r, 422, "invalid_request")["message"] == "request body is not valid JSON"
    # wrong schema: missing field, wrong types, unknown field
    _envelope(client.post(f"{V1}/adapters", json={"id": "x"}), 422, "invalid_request")
    _envelope(
        client.post(f"{V1}/adapters", json={"id": 5, "base_model": "demo-base"}), 422, "invalid_request"
    )
    _envelope(client.post(f"{V1}/tenants", json={"id": "t", "colour": "red"}), 422, "invalid_request")
    _envelope(client.post(f"{V1}/tenants", json=["a"]), 422, "invalid_request")
    _envelope(client.get(f"{V1}/adapters", params={"limit": "many"}), 422, "invalid_request")
    _envelope(client.get(f"{V1}/adapters", params={"limit": 0}), 422, "invalid_request")
    _envelope(client.get(f"{V1}/adapters", params={"cursor": "!!garbage"}), 422, "invalid_request")
    _envelope(client.get(f"{V1}/audit", params={"since": "yesterday"}), 422, "invalid_request")
    # bad slugs, in bodies and paths
    for bad in ("Upper", "a..b", "-x", "x" * 64, "a/b", "", "ünï"):
        _envelope(
            client.post(f"{V1}/adapters", json={"id": bad, "base_model": "demo-base"}), 422, "invalid_request"
        )
        _envelope(client.post(f"{V1}/tenants", json={"id": bad}), 422, "invalid_request")
    _envelope(client.get(f"{V1}/adapters/Bad.Slug"), 422, "invalid_request")
    _envelope(client.get(f"{V1}/tenants/UPPER"), 422, "invalid_request")
    # base model rules: target_modules a non-empty JSON list
    bm = demo_base_model("other")
    for field, value in (
        ("target_modules", "all-linear"),
        ("target_modules", []),
        ("target_modules", [1, 2]),
        ("max_lora_rank", 0),
        ("max_lora_rank", "8"),
        ("module_shapes", {"q_proj": [256]}),
        ("name", "Bad Name"),
    ):
        _envelope(client.post(f"{V1}/base-models", json={**bm, field: value}), 422, "invalid_request")
    _envelope(client.post(f"{V1}/adapters", json={"id": "x", "base_model": "ghost"}), 422, "invalid_request")
    # wrong method, unknown route
    _envelope(client.get(f"{V1}/no/such/route"), 404, "not_found")
    _envelope(client.delete(f"{V1}/adapters"), 405, "method_not_allowed")


def test_404s_and_conflicts(client: TestClient) -> None:
    seed_adapter(client)
    _envelope(client.get(f"{V1}/adapters/ghost"), 404, "adapter_not_found")
    _envelope(client.get(f"{V1}/adapters/ghost/versions"), 404, "adapter_not_found")
    _envelope(client.get(f"{V1}/adapters/support/versions/v7"), 404, "version_not_found")
    _envelope(client.get(f"{V1}/base-models/ghost"), 404, "base_model_not_found")
    _envelope(client.get(f"{V1}/tenants/ghost"), 404, "tenant_not_found")
    _envelope(client.post(f"{V1}/adapters/ghost/disable"), 404, "adapter_not_found")
    _envelope(
        client.post(f"{V1}/adapters/ghost/versions", json={"source_uri": "s3://b/p/"}),
        404,
        "adapter_not_found",
    )
    _envelope(client.post(f"{V1}/base-models", json=demo_base_model()), 409, "base_model_exists")
    _envelope(
        client.post(f"{V1}/adapters", json={"id": "support", "base_model": "demo-base"}),
        409,
        "adapter_exists",
    )
    client.post(f"{V1}/tenants", json={"id": "acme"})
    _envelope(client.post(f"{V1}/tenants", json={"id": "acme"}), 409, "tenant_exists")


def test_records_and_pagination(client: TestClient, factory: Any) -> None:
    seed_adapter(client, "a-000")
    bm = client.get(f"{V1}/base-models/demo-base").json()
    assert bm["hf_id"] == "loraplane/demo-base" and bm["max_lora_rank"] == 64
    assert bm["module_shapes"]["down_proj"] == [512, 256]
    for i in range(1, 7):
        r = client.post(
            f"{V1}/adapters",
            json={"id": f"a-{i:03d}", "base_model": "demo-base", "owner": "team-b" if i % 2 else "team-a"},
        )
        assert r.status_code == 201
        rec = r.json()
        assert set(rec) == {
            "id", "base_model", "owner", "description", "status",
            "active_version", "canary_version", "canary_weight", "hot", "on_load_failure",
            "approvals_required", "limits", "created_at", "canary_policy",
        }  # fmt: skip
        assert rec["created_at"].endswith("Z") or rec["created_at"].endswith("+00:00")
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = client.get(f"{V1}/adapters", params=params).json()
        assert set(page) == {"data", "next_cursor"}
        seen += [a["id"] for a in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"a-{i:03d}" for i in range(7)]
    assert [a["id"] for a in client.get(f"{V1}/adapters", params={"owner": "team-a"}).json()["data"]] == [
        "a-000", "a-002", "a-004", "a-006",
    ]  # fmt: skip
    assert client.get(f"{V1}/adapters", params={"base_model": "nothing"}).json() == {
        "data": [],
        "next_cursor": None,
    }
    # limit above 500 is clamped, not refused
    big = client.get(f"{V1}/audit", params={"limit": 100000})
    assert big.status_code == 200 and big.json()["next_cursor"] is None
    # versions: record fields and pagination
    add_versions(factory, "a-001", 3)
    v = client.get(f"{V1}/adapters/a-001/versions/v2").json()
    assert set(v) == {
        "adapter_id", "version", "status", "rank", "lora_alpha", "target_modules", "files",
        "storage_uri", "rollback_to", "quality_gate", "quality_gate_details", "created_by", "created_at",
        "source_uri", "source_revision", "quality_gate_by",
    }  # fmt: skip
    assert v["files"][0] == {"name": "adapter_config.json", "size": 10, "sha256": f"{1:064x}"}
    p1 = client.get(f"{V1}/adapters/a-001/versions", params={"limit": 2}).json()
    p2 = client.get(f"{V1}/adapters/a-001/versions", params={"limit": 2, "cursor": p1["next_cursor"]}).json()
    assert [x["version"] for x in p1["data"] + p2["data"]] == ["v1", "v2", "v3"] and p2["next_cursor"] is None
    d = client.get(f"{V1}/adapters/a-001").json()
    assert [x["version"] for x in d["versions"]] == ["v1", "v2", "v3"]


def test_tenants_keys_grants(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    r = client.post(f"{V1}/tenants", json={"id": "acme", "limits": {"rpm": 60}})
    assert r.status_code == 201
    t = r.json()
    assert set(t) == {"id", "name", "limits", "base_model_access", "created_at"}
    assert t["name"] == "acme" and t["base_model_access"] is False
    assert t["limits"] == {"rpm": 60, "tpm": None, "max_concurrency": None, "max_cold_waiters": None}
    # PATCH merges limits key by key; explicit null means unlimited
    r = client.patch(f"{V1}/tenants/acme", json={"limits": {"tpm": 1000}})
    assert r.json()["limits"] == {"rpm": 60, "tpm": 1000, "max_concurrency": None, "max_cold_waiters": None}
    r = client.patch(
        f"{V1}/tenants/acme", json={"limits": {"rpm": None, "max_concurrency": 4}, "name": "Acme"}
    )
    assert (
        r.json()["limits"] == {"rpm": None, "tpm": 1000, "max_concurrency": 4, "max_cold_waiters": None}
        and r.json()["name"] == "Acme"
    )
    r = client.patch(f"{V1}/tenants/acme", json={"base_model_access": True})
    assert r.json()["base_model_access"] is True and r.json()["limits"]["tpm"] == 1000
    for bad in (
        {"limits": {"rpm": -1}},
        {"limits": {"burst": 3}},
        {"base_model_access": "yes"},
        {"name": None},
    ):
        assert client.patch(f"{V1}/tenants/acme", json=bad).status_code == 422, bad
    # keys: shown once, stored as a hash only
    r = client.post(f"{V1}/tenants/acme/keys")
    assert r.status_code == 201
    k = r.json()
    assert set(k) == {"key_id", "key", "prefix", "created_at"}
    assert k["prefix"] == key_prefix(k["key"])
    described = client.get(f"{V1}/tenants/acme")
    assert k["key"] not in described.text
    assert [x["key_id"] for x in described.json()["keys"]] == [k["key_id"]]
    from kit.db import session_scope
    from registry.services.snapshot import load_snapshot

    with session_scope(factory) as s:
        snap = load_snapshot(s)
    assert snap.keys_by_prefix[k["prefix"]][0].key_hash == hash_key(k["key"])
    assert k["key"] not in client.get(f"{V1}/audit", params={"limit": 500}).text
    _envelope(client.delete(f"{V1}/tenants/acme/keys/key_nope"), 404, "key_not_found")
    client.post(f"{V1}/tenants", json={"id": "other"})
    _envelope(client.delete(f"{V1}/tenants/other/keys/{k['key_id']}"), 404, "key_not_found")
    r = client.delete(f"{V1}/tenants/acme/keys/{k['key_id']}")
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    with session_scope(factory) as s:
        assert k["prefix"] not in load_snapshot(s).keys_by_prefix
    # grants: PUT answers 200 whether new or not
    r = client.put(f"{V1}/tenants/acme/grants/support")
    assert r.status_code == 200
    assert r.json() == {"tenant_id": "acme", "adapter_id": "support", "rpm": None, "tpm": None}
    r = client.put(f"{V1}/tenants/acme/grants/support", json={"rpm": 10, "tpm": 500})
    assert r.status_code == 200 and r.json()["rpm"] == 10 and r.json()["tpm"] == 500
    assert client.get(f"{V1}/tenants/acme").json()["grants"] == [r.json()]
    _envelope(client.put(f"{V1}/tenants/acme/grants/ghost"), 404, "adapter_not_found")
    _envelope(client.put(f"{V1}/tenants/ghost/grants/support"), 404, "tenant_not_found")
    _envelope(client.put(f"{V1}/tenants/acme/grants/support", json={"rpm": "x"}), 422, "invalid_request")
    assert client.delete(f"{V1}/tenants/acme/grants/support").status_code == 200
    _envelope(client.delete(f"{V1}/tenants/acme/grants/support"), 404, "grant_not_found")
    page = client.get(f"{V1}/tenants", params={"limit": 1}).json()
    assert [t["id"] for t in page["data"]] == ["acme"] and page["next_cursor"]


def test_audit_completeness_and_filters(client: TestClient, factory: Any) -> None:
    import anyio

    from registry.services.audit import ACTIONS, DbAuditSink

    seed_adapter(client)
    add_versions(factory, "support", 3)
    A = f"{V1}/adapters/support"
    client.post(f"{A}/versions/v1/promote")
    client.post(f"{A}/versions/v2/promote")
    client.post(f"{A}/versions/v3/promote", json={"canary_weight": 10})
    client.post(f"{A}/rollback")
    client.post(f"{A}/versions/v3/promote", json={"canary_weight": 10})
    client.delete(f"{A}/canary")
    client.post(f"{A}/disable")
    client.post(f"{A}/enable")
    client.post(f"{A}/versions/v3/disable")
    client.post(f"{A}/versions/v3/enable")
    client.patch(A, json={"hot": True})
    client.post(f"{A}/versions/v2/quality-gate", json={"status": "passed", "details": {"acc": 0.9}})
    client.post(f"{V1}/tenants", json={"id": "acme"})
    client.patch(f"{V1}/tenants/acme", json={"name": "ACME"})
    key_id = client.post(f"{V1}/tenants/acme/keys").json()["key_id"]
    client.delete(f"{V1}/tenants/acme/keys/{key_id}")
    client.put(f"{V1}/tenants/acme/grants/support")
    client.delete(f"{V1}/tenants/acme/grants/support")
    sink = DbAuditSink(factory)

    async def router_events() -> None:
        r = "http://127.0.0.1:9001"
        await sink.record(
            actor="router", action="adapter.loaded", subject_type="adapter", subject_id="support",
            details={"version": "v1", "replica": r, "duration_ms": 12.5},
        )  # fmt: skip
        await sink.record(
            actor="router", action="adapter.unloaded", subject_type="adapter", subject_id="support",
            details={"version": "v1", "replica": r},
        )  # fmt: skip
        await sink.record(
            actor="router", action="adapter.load_failed", subject_type="adapter", subject_id="support",
            details={"version": "v2", "replica": r, "reason": "engine said no"},
        )  # fmt: skip
        await sink.record(
            actor="router", action="adapter.hash_mismatch", subject_type="adapter", subject_id="support",
            details={"version": "v2", "replica": r, "reason": "sha256 differs"},
        )  # fmt: skip

    anyio.run(router_events)
    events = client.get(f"{V1}/audit", params={"limit": 500}).json()["data"]
    assert {e["action"] for e in events} == set(ACTIONS)
    e = events[0]
    assert set(e) == {"id", "ts", "actor", "action", "subject_type", "subject_id", "details"}
    for ev in events:
        if ev["action"].startswith(("version.", "adapter.")):
            assert ev["subject_type"] == "adapter" and ev["subject_id"] == "support", ev
        if ev["action"].startswith(("key.", "grant.", "tenant.")):
            assert ev["subject_type"] == "tenant" and ev["subject_id"] == "acme", ev
        if ev["action"].startswith("version."):
            assert ev["details"]["version"].startswith("v"), ev
    loaded = client.get(f"{V1}/audit", params={"action": "adapter.loaded"}).json()["data"]
    assert loaded[0]["details"] == {"version": "v1", "replica": "http://127.0.0.1:9001", "duration_ms": 12.5}
    tenant_events = client.get(f"{V1}/audit", params={"subject_type": "tenant", "subject_id": "acme"}).json()[
        "data"
    ]
    assert [x["action"] for x in tenant_events] == [
        "tenant.created", "tenant.updated", "key.issued", "key.revoked", "grant.added", "grant.removed",
    ]  # fmt: skip
    last_ts = events[-1]["ts"]
    since = client.get(f"{V1}/audit", params={"since": last_ts}).json()["data"]
    assert [x["id"] for x in since] == [events[-1]["id"]]
    assert client.get(f"{V1}/audit", params={"since": "2999-01-01T00:00:00Z"}).json()["data"] == []
    # pages are chronological and cover everything once
    ids: list[int] = []
    cursor = None
    for _ in range(50):
        page = client.get(f"{V1}/audit", params={"limit": 7, **({"cursor": cursor} if cursor else {})}).json()
        ids += [x["id"] for x in page["data"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert ids == sorted(ids) == [x["id"] for x in events]


def test_failed_change_leaves_no_audit_row(factory: Any, client: TestClient) -> None:
    """Audit + revision are in the change's transaction: a change that fails after them rolls
    everything back."""
    from kit.db import session_scope
    from registry.services import lifecycle
    from registry.services.audit import list_events
    from registry.services.snapshot import current_revision

    seed_adapter(client)
    add_versions(factory, "support", 1)
    with session_scope(factory) as s:
        before = (len(list_events(s, limit=500).data), current_revision(s))

    class Boom(Exception):
        pass

    with pytest.raises(Boom), session_scope(factory) as s:
        lifecycle.promote(s, "support", "v1", actor="test")
        raise Boom
    with session_scope(factory) as s:
        assert (len(list_events(s, limit=500).data), current_revision(s)) == before
    assert client.get(f"{V1}/adapters/support").json()["active_version"] is None


class _Directory:
    """A minimal in-memory ReplicaDirectory (unit-level: the router provides the real ones)."""

    def __init__(self) -> None:
        self.prewarms: list[tuple[str, str, int]] = []

    async def list_replicas(self) -> list[dict[str, Any]]:
        return [
            {
                "url": "http://127.0.0.1:9001", "pool": "default", "base_model": "demo-base", "healthy": True,
                "adapters": [{"adapter": "support", "version": "v1", "lora_name": "support@v1-00000000",
                              "state": "resident"}],
                "running": 1, "waiting": 0, "last_seen": "2026-01-01T00:00:00Z",
            }
        ]  # fmt: skip

    async def plan(self) -> dict[str, Any]:
        return {"published": False, "adapters": []}

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        self.prewarms.append((adapter_id, version, replicas))
        return {"targets": ["http://127.0.0.1:9001"][:replicas]}


def test_replicas_and_prewarm(tmp_path: Any, db_url: str, engine: Any, factory: Any) -> None:
    from registry.api import create_admin_app
    from tests.registry.core_support import AUTH

    directory = _Directory()
    c = TestClient(
        create_admin_app(make_settings(tmp_path, db_url), engine=engine, replica_directory=directory)
    )
    c.headers.update(AUTH)
    seed_adapter(c)
    r = c.get(f"{V1}/replicas")
    assert r.status_code == 200
    assert r.json()["data"][0]["adapters"][0]["lora_name"] == "support@v1-00000000"
    _envelope(c.post(f"{V1}/adapters/ghost/prewarm"), 404, "adapter_not_found")
    _envelope(c.post(f"{V1}/adapters/support/prewarm"), 409, "no_active_version")
    add_versions(factory, "support", 1)
    c.post(f"{V1}/adapters/support/versions/v1/promote")
    r = c.post(f"{V1}/adapters/support/prewarm", json={"replicas": 2})
    assert r.status_code == 202
    assert r.json()["targets"] == ["http://127.0.0.1:9001"] and r.json()["version"] == "v1"
    assert c.post(f"{V1}/adapters/support/prewarm").status_code == 202
    assert directory.prewarms == [("support", "v1", 2), ("support", "v1", 1)]
    _envelope(c.post(f"{V1}/adapters/support/prewarm", json={"replicas": 0}), 422, "invalid_request")
    # without a directory: 503 replicas_unavailable
    c2 = TestClient(create_admin_app(make_settings(tmp_path, db_url), engine=engine))
    c2.headers.update(AUTH)
    _envelope(c2.get(f"{V1}/replicas"), 503, "replicas_unavailable")
    _envelope(c2.post(f"{V1}/adapters/support/prewarm"), 503, "replicas_unavailable")
