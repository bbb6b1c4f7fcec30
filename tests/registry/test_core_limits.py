"""Limits per adapter (``PATCH /adapters/{id}`` ``limits``) and per owner (``PUT
/owners/{owner}/limits``, ``GET /owners/{owner}``), SPEC §15: validation, audit, revision, the
routing snapshot that carries them to gateways, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient

from kit.db import session_scope
from registry.services.snapshot import apply_changes, load_snapshot
from registry.snapshot import Limits
from tests.registry.core_support import seed_adapter

V1 = "/admin/v1"
A = f"{V1}/adapters/support"


def _owner() -> str:
    return f"team {uuid.uuid4().hex[:8]}"  # a space too: owners are free text, not slugs


def _events(c: TestClient, action: str) -> list[dict[str, Any]]:
    return list(c.get(f"{V1}/audit", params={"action": action, "limit": 500}).json()["data"])


def _error(r: Any, status: int, code: str, field: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    if field is not None:
        assert field in str(err["details"]), err


def test_adapter_limits_patch_merge_clear_and_snapshot(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    assert client.get(A).json()["limits"] == {"rpm": None, "tpm": None, "max_concurrency": None}
    r = client.patch(A, json={"limits": {"rpm": 100, "max_concurrency": 4}})
    assert r.status_code == 200, r.text
    assert r.json()["limits"] == {"rpm": 100, "tpm": None, "max_concurrency": 4}
    r = client.patch(A, json={"limits": {"tpm": 50000}})  # merged key by key
    assert r.json()["limits"] == {"rpm": 100, "tpm": 50000, "max_concurrency": 4}
    assert client.get(A).json()["limits"] == {"rpm": 100, "tpm": 50000, "max_concurrency": 4}
    listed = {a["id"]: a["limits"] for a in client.get(f"{V1}/adapters").json()["data"]}
    assert listed["support"]["tpm"] == 50000
    events = _events(client, "adapter.updated")
    assert [e["details"] for e in events] == [
        {"limits": {"rpm": 100, "tpm": None, "max_concurrency": 4}},
        {"limits": {"rpm": 100, "tpm": 50000, "max_concurrency": 4}},
    ]
    with session_scope(factory) as s:
        snap = load_snapshot(s)
    info = snap.adapters["support"]
    assert info.limits == Limits(rpm=100, tpm=50000, max_concurrency=4) and info.owner == "team-a"
    # the same value again writes nothing; null clears all three
    rev = snap.revision
    assert client.patch(A, json={"limits": {"rpm": 100}}).status_code == 200
    assert len(_events(client, "adapter.updated")) == 2
    r = client.patch(A, json={"limits": None})
    assert r.json()["limits"] == {"rpm": None, "tpm": None, "max_concurrency": None}
    with session_scope(factory) as s:
        cleared = apply_changes(s, snap, ["adapter:support"], rev + 1)
    assert cleared is not None and cleared.adapters["support"].limits == Limits()


def test_adapter_limits_bad_input_is_422_and_changes_nothing(client: TestClient) -> None:
    seed_adapter(client)
    assert client.patch(A, json={"limits": {"rpm": 7}}).status_code == 200
    for bad in (
        {"rpm": -1},
        {"tpm": 2**31},  # past the INTEGER column: 422, never a 500 on PostgreSQL
        {"max_concurrency": 1.5},
        {"rpm": True},
        {"rpm": "10"},
        {"burst": 3},
    ):
        _error(client.patch(A, json={"limits": bad, "hot": True}), 422, "invalid_request")
    d = client.get(A).json()
    assert d["limits"]["rpm"] == 7 and d["hot"] is False  # nothing half-written
    _error(client.patch(f"{V1}/adapters/nosuch", json={"limits": {"rpm": 1}}), 404, "adapter_not_found")
    assert client.patch(A, json={"limits": {"tpm": 2**31 - 1}}).json()["limits"]["tpm"] == 2**31 - 1


def test_owner_limits_put_get_audit_and_snapshot(client: TestClient, factory: Any) -> None:
    owner = _owner()
    seed_adapter(client, "one")
    client.patch(f"{V1}/adapters/one", json={"owner": owner})
    seed_adapter(client, "two")
    client.patch(f"{V1}/adapters/two", json={"owner": owner})
    path = f"{V1}/owners/{owner}"
    got = client.get(path).json()
    assert got["owner"] == owner and got["adapters"] == ["one", "two"] and got["updated_at"] is None
    assert got["limits"] == {"rpm": None, "tpm": None, "max_concurrency": None}
    with session_scope(factory) as s:
        before = load_snapshot(s)
    r = client.put(f"{path}/limits", json={"rpm": 30, "max_concurrency": 2})
    assert r.status_code == 200, r.text
    assert r.json()["limits"] == {"rpm": 30, "tpm": None, "max_concurrency": 2}
    assert r.json()["adapters"] == ["one", "two"] and r.json()["updated_at"]
    assert client.get(path).json()["limits"]["rpm"] == 30
    [event] = [e for e in _events(client, "owner.limits_updated") if e["subject_id"] == owner]
    assert event["subject_type"] == "owner"
    assert event["details"] == {"limits": {"rpm": 30, "tpm": None, "max_concurrency": 2}}
    with session_scope(factory) as s:
        snap = load_snapshot(s)
        # the change feed's subject for it: applied without a whole reload
        applied = apply_changes(s, before, [f"owner:{owner}"], snap.revision)
    assert snap.owners[owner] == Limits(rpm=30, max_concurrency=2)
    assert snap.adapters["one"].owner == owner
    assert applied is not None and applied.owners[owner] == Limits(rpm=30, max_concurrency=2)
    # PUT replaces: a key left out is unlimited; the same limits again write nothing
    r = client.put(f"{path}/limits", json={"tpm": 9000})
    assert r.json()["limits"] == {"rpm": None, "tpm": 9000, "max_concurrency": None}
    client.put(f"{path}/limits", json={"tpm": 9000})
    assert len([e for e in _events(client, "owner.limits_updated") if e["subject_id"] == owner]) == 2


def test_owner_without_adapters_and_bad_input(client: TestClient) -> None:
    owner = _owner()
    _error(client.get(f"{V1}/owners/{owner}"), 404, "owner_not_found")
    # limits may be set before the owner's first adapter exists
    r = client.put(f"{V1}/owners/{owner}/limits", json={"rpm": 5})
    assert r.status_code == 200 and r.json()["adapters"] == []
    assert client.get(f"{V1}/owners/{owner}").json()["limits"]["rpm"] == 5
    for bad in ({"rpm": -3}, {"tpm": 2**40}, {"max_concurrency": "2"}, {"extra": 1}):
        _error(client.put(f"{V1}/owners/{owner}/limits", json=bad), 422, "invalid_request")
    _error(client.put(f"{V1}/owners/{owner}/limits", content=b"[1]"), 422, "invalid_request")
    _error(client.put(f"{V1}/owners/a%00b/limits", json={"rpm": 1}), 422, "invalid_request", "owner")
    _error(client.get(f"{V1}/owners/{'x' * 256}"), 422, "invalid_request", "owner")
    assert client.get(f"{V1}/owners/{owner}").json()["limits"] == {
        "rpm": 5, "tpm": None, "max_concurrency": None,
    }  # fmt: skip


def test_owner_routes_need_the_admin_token(client: TestClient) -> None:
    seed_adapter(client)
    anon = TestClient(client.app)
    assert anon.get(f"{V1}/owners/team-a").status_code == 401
    assert anon.put(f"{V1}/owners/team-a/limits", json={"rpm": 1}).status_code == 401
    assert anon.patch(A, json={"limits": {"rpm": 1}}).status_code == 401
    assert client.get(A).json()["limits"]["rpm"] is None


def test_concurrent_first_puts_of_one_owner_all_succeed(client: TestClient) -> None:
    """Two admins setting a new owner's limits at once: both answered, one row, no 500."""
    from concurrent.futures import ThreadPoolExecutor

    owner = _owner()

    def put(i: int) -> int:
        return client.put(f"{V1}/owners/{owner}/limits", json={"rpm": 10 + i}).status_code

    with ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(put, range(6)))
    assert codes == [200] * 6
    rpm = client.get(f"{V1}/owners/{owner}").json()["limits"]["rpm"]
    assert rpm in range(10, 16)
    events = [e for e in _events(client, "owner.limits_updated") if e["subject_id"] == owner]
    assert 1 <= len(events) <= 6 and events[-1]["details"]["limits"]["rpm"] == rpm
