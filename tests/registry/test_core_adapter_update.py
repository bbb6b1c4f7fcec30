"""``hot`` on adapters and ``PATCH /adapters/{id}`` (description, owner, hot): records, one
transaction with an ``adapter.updated`` event and a revision bump published on the change feed,
error shapes, the routing snapshot, OpenAPI — on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from kit.db import session_scope
from registry.services.snapshot import current_revision, load_snapshot
from tests.registry.core_support import (
    AUTH,
    make_settings,
    seed_adapter,
)

V1 = "/admin/v1"
A = f"{V1}/adapters/support"

RECORD_FIELDS = {
    "id", "base_model", "owner", "description", "status", "active_version", "canary_version",
    "canary_weight", "hot", "on_load_failure", "approvals_required", "limits", "created_at",
    "canary_policy",
}  # fmt: skip


class RecordingFeed:
    """A change feed that remembers what was published (the admin API publishes after commit)."""

    def __init__(self) -> None:
        self.published: list[int] = []

    def publish(self, revision: int, subjects: frozenset[str] = frozenset({"*"})) -> None:
        self.published.append(revision)

    def listen(self) -> Any:  # pragma: no cover - not used here
        raise NotImplementedError


@pytest.fixture
def feed() -> RecordingFeed:
    return RecordingFeed()


@pytest.fixture
def client(tmp_path: Path, db_url: str, engine: Engine, feed: RecordingFeed) -> Iterator[TestClient]:
    from registry.api import create_admin_app

    app = create_admin_app(make_settings(tmp_path, db_url), engine=engine, feed=feed)
    with TestClient(app, headers=AUTH) as c:
        yield c


def _revision(factory: Any) -> int:
    with session_scope(factory) as s:
        return current_revision(s)


def _events(c: TestClient, action: str = "adapter.updated") -> list[dict[str, Any]]:
    return list(c.get(f"{V1}/audit", params={"action": action, "limit": 500}).json()["data"])


def _error(r: Any, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code and body["error"]["message"]


def test_hot_in_create_describe_list_and_snapshot(client: TestClient, factory: Any) -> None:
    seed_adapter(client)  # not hot by default
    r = client.post(f"{V1}/adapters", json={"id": "warm", "base_model": "demo-base", "hot": True})
    assert r.status_code == 201, r.text
    assert set(r.json()) == RECORD_FIELDS and r.json()["hot"] is True
    created = _events(client, "adapter.created")
    assert {e["subject_id"]: e["details"]["hot"] for e in created} == {"support": False, "warm": True}
    assert client.get(f"{V1}/adapters/warm").json()["hot"] is True
    assert client.get(A).json()["hot"] is False
    listed = {a["id"]: a["hot"] for a in client.get(f"{V1}/adapters").json()["data"]}
    assert listed == {"support": False, "warm": True}
    with session_scope(factory) as s:
        snap = load_snapshot(s)
    assert snap.adapters["warm"].hot is True and snap.adapters["support"].hot is False
    for bad in ("yes", 1, None):
        r = client.post(f"{V1}/adapters", json={"id": "x", "base_model": "demo-base", "hot": bad})
        _error(r, 422, "invalid_request")


def test_patch_changes_fields_in_one_audited_revision(
    client: TestClient, factory: Any, feed: RecordingFeed
) -> None:
    seed_adapter(client)
    rev = _revision(factory)
    r = client.patch(A, json={"hot": True})
    assert r.status_code == 200, r.text
    rec = r.json()
    assert set(rec) == RECORD_FIELDS
    assert (rec["id"], rec["hot"], rec["owner"], rec["description"]) == ("support", True, "team-a", None)
    assert _revision(factory) == rev + 1
    assert feed.published[-1] == rev + 1  # published on the change feed after the commit
    [event] = _events(client)
    assert (event["actor"], event["subject_type"], event["subject_id"]) == ("bootstrap", "adapter", "support")
    assert event["details"] == {"hot": True}
    assert client.get(A).json()["hot"] is True
    with session_scope(factory) as s:
        assert load_snapshot(s).adapters["support"].hot is True

    # several fields at once; null clears owner; only what really changed is in the event
    r = client.patch(A, json={"description": "answers tickets", "owner": None, "hot": True})
    assert r.status_code == 200, r.text
    assert (r.json()["description"], r.json()["owner"], r.json()["hot"]) == ("answers tickets", None, True)
    assert _revision(factory) == rev + 2 and feed.published[-1] == rev + 2
    assert _events(client)[-1]["details"] == {"description": "answers tickets", "owner": None}

    # unmark
    assert client.patch(A, json={"hot": False}).json()["hot"] is False
    assert _events(client)[-1]["details"] == {"hot": False}
    assert _revision(factory) == rev + 3
    with session_scope(factory) as s:
        assert load_snapshot(s).adapters["support"].hot is False

    # nothing changes: 200 with the record, no event, no revision bump
    published = len(feed.published)
    for same in ({}, {"hot": False}, {"description": "answers tickets"}):
        r = client.patch(A, json=same)
        assert r.status_code == 200 and r.json()["description"] == "answers tickets"
    assert _revision(factory) == rev + 3 and len(_events(client)) == 3
    assert len(feed.published) == published


def test_patch_errors(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    rev = _revision(factory)
    _error(client.patch(f"{V1}/adapters/ghost", json={"hot": True}), 404, "adapter_not_found")
    _error(client.patch(f"{V1}/adapters/Bad.Slug", json={"hot": True}), 422, "invalid_request")
    for bad in (
        {"hot": "yes"},
        {"hot": 1},
        {"hot": None},
        {"owner": 5},
        {"description": ["a"]},
        {"owner": "x" * 256},
        {"colour": "red"},
        {"id": "renamed"},
        {"status": "disabled"},
        {"base_model": "other"},
        ["hot"],
        "hot",
    ):
        _error(client.patch(A, json=bad), 422, "invalid_request")
    r = client.patch(A, content=b"{nope", headers={"content-type": "application/json"})
    _error(r, 422, "invalid_request")
    assert _revision(factory) == rev and _events(client) == []
    assert client.get(A).json()["hot"] is False


def test_create_refuses_an_owner_longer_than_the_column(client: TestClient) -> None:
    seed_adapter(client)
    r = client.post(f"{V1}/adapters", json={"id": "long", "base_model": "demo-base", "owner": "o" * 256})
    _error(r, 422, "invalid_request")


def test_openapi_describes_patch(client: TestClient) -> None:
    doc = TestClient(client.app).get(f"{V1}/openapi.json").json()
    op = doc["paths"]["/admin/v1/adapters/{adapter_id}"]["patch"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    assert set(schema["properties"]) == {
        "description", "owner", "hot", "approvals_required", "on_load_failure", "limits", "canary_policy"
    }  # fmt: skip
    assert schema.get("additionalProperties") is False
    assert "200" in op["responses"] and "422" in op["responses"] and "404" in op["responses"]
    out = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert "hot" in doc["components"]["schemas"][out]["required"]
    create = doc["components"]["schemas"]["AdapterCreate"]
    assert "hot" in create["properties"]


def test_on_load_failure_set_on_create_and_patch_and_carried_in_the_snapshot(
    client: TestClient, factory: Any
) -> None:
    seed_adapter(client)
    assert client.get(A).json()["on_load_failure"] == "error"  # default: today's behaviour
    r = client.post(
        f"{V1}/adapters", json={"id": "kind", "base_model": "demo-base", "on_load_failure": "base_model"}
    )
    assert r.status_code == 201 and r.json()["on_load_failure"] == "base_model"
    r = client.patch(A, json={"on_load_failure": "previous_version"})
    assert r.status_code == 200 and r.json()["on_load_failure"] == "previous_version"
    assert _events(client)[-1]["details"] == {"on_load_failure": "previous_version"}
    _error(client.patch(A, json={"on_load_failure": "retry"}), 422, "invalid_request")
    with session_scope(factory) as s:
        snap = load_snapshot(s)
    assert snap.adapters["support"].on_load_failure == "previous_version"
    assert snap.adapters["kind"].on_load_failure == "base_model"
