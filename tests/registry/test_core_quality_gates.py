"""Quality gates: a version can start ``pending`` at upload (multipart field, query parameter or
JSON field), ``POST …/versions/{v}/quality-gate`` records a result with its details (one audited
transaction), promotion (active or canary) of a ``pending``/``failed`` version is a 409 that
changes nothing unless forced (and the forced promotion is audited), rollback is not gated, and
the routing snapshot does not change — on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from kit.db import session_scope
from registry.adapter_factory import write_adapter
from registry.services.gates import MAX_DETAILS_BYTES
from registry.services.snapshot import current_revision, load_snapshot
from registry.storage.local import LocalArtifactStore
from tests.registry.core_support import (
    AUTH,
    add_versions,
    make_settings,
    seed_adapter,
    statuses,
)

V1 = "/admin/v1"
A = f"{V1}/adapters/support"


def _revision(factory: Any) -> int:
    with session_scope(factory) as s:
        return current_revision(s)


def _events(c: TestClient, action: str | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"limit": 500}
    if action is not None:
        params["action"] = action
    return list(c.get(f"{V1}/audit", params=params).json()["data"])


def _error(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code and body["error"]["message"]
    err: dict[str, Any] = body["error"]
    return err


def _gate(c: TestClient, version: str, status: str, details: Any = None, adapter: str = "support") -> Any:
    body: dict[str, Any] = {"status": status}
    if details is not None:
        body["details"] = details
    return c.post(f"{V1}/adapters/{adapter}/versions/{version}/quality-gate", json=body)


# --------------------------------------------------------------------------- upload


def _files(d: Path, gate: str | None = None) -> dict[str, Any]:
    files = [("files", (p.name, p.read_bytes())) for p in sorted(d.iterdir())]
    return {"files": files, "data": {"quality_gate": gate} if gate is not None else None}


def _stored(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def upload_client(
    tmp_path: Path, db_url: str, engine: Engine
) -> Iterator[tuple[TestClient, LocalArtifactStore, Path]]:
    from registry.api import create_admin_app

    incoming = tmp_path / "incoming"
    incoming.mkdir()
    settings = make_settings(tmp_path, db_url, allowed_sources=[incoming.as_uri() + "/"])
    store = LocalArtifactStore(settings.resolved_artifact_dir())
    with TestClient(create_admin_app(settings, engine=engine, store=store), headers=AUTH) as c:
        seed_adapter(c, "ad")
        yield c, store, incoming


def test_upload_starts_skipped_or_pending(
    upload_client: tuple[TestClient, LocalArtifactStore, Path], tmp_path: Path
) -> None:
    c, _store, incoming = upload_client
    url = f"{V1}/adapters/ad/versions"
    d = write_adapter(tmp_path / "a")
    v1 = c.post(url, **_files(d))
    assert v1.status_code == 201, v1.text
    assert (v1.json()["quality_gate"], v1.json()["quality_gate_details"]) == ("skipped", None)
    # multipart text field, query parameter, both (agreeing), explicit skipped
    v2 = c.post(url, **_files(d, "pending"))
    assert v2.status_code == 201, v2.text
    assert (v2.json()["version"], v2.json()["quality_gate"]) == ("v2", "pending")
    v3 = c.post(url, params={"quality_gate": "pending"}, **_files(d))
    assert v3.status_code == 201 and v3.json()["quality_gate"] == "pending"
    v4 = c.post(url, params={"quality_gate": "pending"}, **_files(d, " pending "))
    assert v4.status_code == 201 and v4.json()["quality_gate"] == "pending"
    v5 = c.post(url, **_files(d, "skipped"))
    assert v5.status_code == 201 and v5.json()["quality_gate"] == "skipped"
    # JSON registration by reference: field or query parameter
    src = incoming / "a"
    write_adapter(src)
    v6 = c.post(url, json={"source_uri": src.as_uri() + "/", "quality_gate": "pending"})
    assert v6.status_code == 201, v6.text
    assert v6.json()["quality_gate"] == "pending"
    v7 = c.post(url, params={"quality_gate": "pending"}, json={"source_uri": src.as_uri()})
    assert v7.status_code == 201 and v7.json()["quality_gate"] == "pending"
    v8 = c.post(url, json={"source_uri": src.as_uri()})
    assert v8.status_code == 201 and v8.json()["quality_gate"] == "skipped"

    listed = {v["version"]: v["quality_gate"] for v in c.get(url).json()["data"]}
    assert listed == {
        "v1": "skipped", "v2": "pending", "v3": "pending", "v4": "pending",
        "v5": "skipped", "v6": "pending", "v7": "pending", "v8": "skipped",
    }  # fmt: skip
    uploaded = {e["details"]["version"]: e["details"]["quality_gate"] for e in _events(c, "version.uploaded")}
    assert uploaded == listed
    # the field may also come after the files
    files = [("files", (p.name, p.read_bytes())) for p in sorted(d.iterdir())]
    late = c.post(url, files=[*files, ("quality_gate", (None, b"pending"))])
    assert late.status_code == 201 and (late.json()["version"], late.json()["quality_gate"]) == (
        "v9",
        "pending",
    )


def test_bad_upload_gates_are_refused_and_write_nothing(
    upload_client: tuple[TestClient, LocalArtifactStore, Path], tmp_path: Path, factory: Any
) -> None:
    c, store, incoming = upload_client
    url = f"{V1}/adapters/ad/versions"
    d = write_adapter(tmp_path / "a")
    src = incoming / "a"
    write_adapter(src)
    rev, events = _revision(factory), _events(c)

    for gate in ("passed", "failed", "bogus", "", "PENDING", "x" * 2000):
        _error(c.post(url, **_files(d, gate)), 422, "invalid_request")
    for gate in ("passed", "failed", "bogus", ""):
        _error(c.post(url, params={"quality_gate": gate}, **_files(d)), 422, "invalid_request")
        _error(
            c.post(url, params={"quality_gate": gate}, json={"source_uri": src.as_uri()}),
            422,
            "invalid_request",
        )
    for bad in ("passed", "failed", "bogus", 1, True):
        r = c.post(url, json={"source_uri": src.as_uri(), "quality_gate": bad})
        _error(r, 422, "invalid_request")
    # twice with different values; the field twice
    err = _error(
        c.post(url, params={"quality_gate": "skipped"}, **_files(d, "pending")), 422, "invalid_request"
    )
    assert err["details"] == {"field": "quality_gate"}
    r = c.post(
        url, params={"quality_gate": "skipped"}, json={"source_uri": src.as_uri(), "quality_gate": "pending"}
    )
    _error(r, 422, "invalid_request")
    twice = [("quality_gate", (None, b"pending")), ("quality_gate", (None, b"pending"))]
    files = [("files", (p.name, p.read_bytes())) for p in sorted(d.iterdir())]
    _error(c.post(url, files=[*twice, *files]), 422, "invalid_request")
    # not UTF-8; a bad field after the files (they were streamed into the store, then dropped)
    _error(c.post(url, files=[("quality_gate", (None, b"\xff\xfe")), *files]), 422, "invalid_request")
    _error(c.post(url, files=[*files, ("quality_gate", (None, b"passed"))]), 422, "invalid_request")

    assert _stored(store.root) == [] and list(store.pending_dir.iterdir()) == []
    assert c.get(url).json()["data"] == []
    assert _revision(factory) == rev and _events(c) == events
    # the next good upload is still v1
    assert c.post(url, **_files(d, "pending")).json()["version"] == "v1"


# --------------------------------------------------------------------------- recording a gate


def test_gate_set_and_reset_with_details_is_audited(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 2)
    rev = _revision(factory)
    scores = {"accuracy": 0.91, "suite": "support-evals", "cases": [{"id": 1, "ok": True}], "run": None}
    r = _gate(client, "v2", "passed", scores)
    assert r.status_code == 200, r.text
    rec = r.json()
    assert (rec["adapter_id"], rec["version"], rec["status"]) == ("support", "v2", "ready")
    assert (rec["quality_gate"], rec["quality_gate_details"]) == ("passed", scores)
    assert _revision(factory) == rev + 1
    [event] = _events(client, "version.quality_gate")
    assert (event["actor"], event["subject_type"], event["subject_id"]) == ("bootstrap", "adapter", "support")
    assert event["details"] == {"version": "v2", "from": "skipped", "to": "passed", "details": scores}
    got = client.get(f"{A}/versions/v2").json()
    assert (got["quality_gate"], got["quality_gate_details"]) == ("passed", scores)
    described = {v["version"]: v["quality_gate"] for v in client.get(A).json()["versions"]}
    assert described == {"v1": "skipped", "v2": "passed"}

    # back to pending: details left out → null
    r = _gate(client, "v2", "pending")
    assert (r.json()["quality_gate"], r.json()["quality_gate_details"]) == ("pending", None)
    assert _events(client, "version.quality_gate")[-1]["details"] == {
        "version": "v2", "from": "passed", "to": "pending", "details": None,
    }  # fmt: skip
    # failed with new details; then the same again changes nothing (no event, no revision bump)
    assert _gate(client, "v2", "failed", {"accuracy": 0.42}).json()["quality_gate"] == "failed"
    rev2 = _revision(factory)
    again = _gate(client, "v2", "failed", {"accuracy": 0.42})
    assert again.status_code == 200 and again.json()["quality_gate_details"] == {"accuracy": 0.42}
    assert _revision(factory) == rev2 and len(_events(client, "version.quality_gate")) == 3
    # same status, new details: recorded
    assert _gate(client, "v2", "failed", {"accuracy": 0.40}).status_code == 200
    assert _events(client, "version.quality_gate")[-1]["details"]["from"] == "failed"
    assert len(_events(client, "version.quality_gate")) == 4
    # explicit null details and skipped
    r = client.post(f"{A}/versions/v2/quality-gate", json={"status": "skipped", "details": None})
    assert (r.json()["quality_gate"], r.json()["quality_gate_details"]) == ("skipped", None)

    # a disabled version's gate can still be recorded
    assert client.post(f"{A}/versions/v1/disable").status_code == 200
    r = _gate(client, "v1", "failed", {"reason": "toxic outputs"})
    assert r.status_code == 200 and (r.json()["status"], r.json()["quality_gate"]) == ("disabled", "failed")


def test_gate_errors_write_nothing(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 1)
    rev, events = _revision(factory), _events(client)
    _error(_gate(client, "v1", "passed", adapter="ghost"), 404, "adapter_not_found")
    _error(_gate(client, "v9", "passed"), 404, "version_not_found")
    _error(_gate(client, "latest", "passed"), 422, "invalid_request")
    _error(_gate(client, "v1", "passed", adapter="Bad.Slug"), 422, "invalid_request")
    url = f"{A}/versions/v1/quality-gate"
    for bad in (
        {},
        {"status": None},
        {"status": "bogus"},
        {"status": "PASSED"},
        {"status": 1},
        {"status": "passed", "details": [1, 2]},
        {"status": "passed", "details": "great"},
        {"status": "passed", "details": 0.9},
        {"status": "passed", "colour": "red"},
        {"status": "passed", "details": {"blob": "x" * (MAX_DETAILS_BYTES + 1)}},
        ["passed"],
        "passed",
    ):
        _error(client.post(url, json=bad), 422, "invalid_request")
    for raw in (
        b"{nope",
        b'{"status": "passed", "details": {"accuracy": NaN}}',
        b'{"status": "passed", "details": {"a": [Infinity]}}',
        b'{"status": "passed", "details": {"s": "\\ud800"}}',
    ):
        r = client.post(url, content=raw, headers={"content-type": "application/json"})
        _error(r, 422, "invalid_request")
    _error(client.post(url), 422, "invalid_request")  # no body
    assert _revision(factory) == rev and _events(client) == events
    got = client.get(f"{A}/versions/v1").json()
    assert (got["quality_gate"], got["quality_gate_details"]) == ("skipped", None)


# --------------------------------------------------------------------------- promotion


def test_blocking_gates_refuse_promotion_and_change_nothing(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 3)
    assert client.post(f"{A}/versions/v1/promote").status_code == 200
    for status, code in (("pending", "quality_gate_pending"), ("failed", "quality_gate_failed")):
        assert _gate(client, "v2", status).status_code == 200
        before, rev, events = statuses(client, "support"), _revision(factory), _events(client)
        for body in (
            None,
            {},
            {"force": False},
            {"canary_weight": 10},
            {"canary_weight": 10, "force": False},
        ):
            r = client.post(f"{A}/versions/v2/promote", json=body)
            err = _error(r, 409, code)
            assert err["details"] == {"version": "v2", "quality_gate": status}
            assert "force" in err["message"]
        assert statuses(client, "support") == before
        assert _revision(factory) == rev and _events(client) == events
    # a blocking gate on the current canary also refuses a weight change
    assert client.post(f"{A}/versions/v3/promote", json={"canary_weight": 10}).status_code == 200
    assert _gate(client, "v3", "pending").status_code == 200
    _error(client.post(f"{A}/versions/v3/promote", json={"canary_weight": 50}), 409, "quality_gate_pending")
    _error(client.post(f"{A}/versions/v3/promote"), 409, "quality_gate_pending")
    assert statuses(client, "support")["weight"] == 10
    # other errors come first: already active, disabled, unknown
    assert _gate(client, "v1", "failed").status_code == 200
    _error(client.post(f"{A}/versions/v1/promote"), 409, "already_active")
    _error(client.post(f"{A}/versions/v9/promote"), 404, "version_not_found")
    # bad force values are request errors
    for bad in ({"force": "yes"}, {"force": 1}, {"force": None}):
        _error(client.post(f"{A}/versions/v2/promote", json=bad), 422, "invalid_request")

    # passed and skipped promote as before, without a forced marker
    assert _gate(client, "v2", "passed", {"accuracy": 0.9}).status_code == 200
    r = client.post(f"{A}/versions/v2/promote", json={"canary_weight": 20})
    assert r.status_code == 200 and r.json()["canary_version"] == "v2"
    r = client.post(f"{A}/versions/v2/promote")
    assert r.status_code == 200 and r.json()["active_version"] == "v2"
    for e in _events(client, "version.canary") + _events(client, "version.promoted"):
        assert "forced_quality_gate" not in e["details"]


def test_force_promotes_and_is_audited_rollback_is_not_gated(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 3)
    client.post(f"{A}/versions/v1/promote")
    assert _gate(client, "v2", "pending").status_code == 200
    assert _gate(client, "v3", "failed", {"accuracy": 0.1}).status_code == 200

    rev = _revision(factory)
    r = client.post(f"{A}/versions/v2/promote", json={"canary_weight": 10, "force": True})
    assert r.status_code == 200, r.text
    assert (r.json()["active_version"], r.json()["canary_version"], r.json()["canary_weight"]) == (
        "v1",
        "v2",
        10,
    )
    [canary] = _events(client, "version.canary")
    assert canary["details"] == {
        "version": "v2", "canary_weight": 10, "replaced": None, "forced_quality_gate": "pending",
    }  # fmt: skip
    assert _revision(factory) == rev + 1

    r = client.post(f"{A}/versions/v3/promote", json={"force": True})
    assert r.status_code == 200, r.text
    st = statuses(client, "support")
    assert (st["active"], st["canary"]) == ("v3", None)
    assert st["versions"] == {"v1": ("retired", None), "v2": ("ready", None), "v3": ("active", "v1")}
    promoted = _events(client, "version.promoted")[-1]
    assert promoted["details"] == {
        "version": "v3", "previous": "v1", "canary_cleared": "v2", "forced_quality_gate": "failed",
    }  # fmt: skip
    # the gate itself is untouched by a forced promotion
    assert client.get(f"{A}/versions/v3").json()["quality_gate"] == "failed"

    # rollback restores v1 whatever its gate says now
    assert _gate(client, "v1", "failed").status_code == 200
    r = client.post(f"{A}/rollback")
    assert r.status_code == 200 and r.json()["active_version"] == "v1"
    # force with a gate that does not block: promoted, no marker
    assert _gate(client, "v2", "passed").status_code == 200
    assert client.post(f"{A}/versions/v2/promote", json={"force": True}).status_code == 200
    assert "forced_quality_gate" not in _events(client, "version.promoted")[-1]["details"]


def test_gates_leave_the_routing_snapshot_alone(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 2)
    client.post(f"{A}/versions/v1/promote")
    with session_scope(factory) as s:
        before = load_snapshot(s)
    assert _gate(client, "v2", "pending", {"run": "ci-123"}).status_code == 200
    assert _gate(client, "v1", "failed").status_code == 200
    with session_scope(factory) as s:
        after = load_snapshot(s)
    assert after.revision == before.revision + 2  # a change like any other: gateways reload
    assert replace(after, revision=before.revision) == before
    # the pending candidate stays servable when pinned (evals run against it before promotion)
    v2 = after.adapters["support"].versions["v2"]
    assert v2.status == "ready" and after.adapters["support"].active_version == "v1"


def test_openapi_describes_gates(client: TestClient) -> None:
    doc = TestClient(client.app).get(f"{V1}/openapi.json").json()
    schemas = doc["components"]["schemas"]

    def ref(obj: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = schemas[obj["$ref"].rsplit("/", 1)[-1]]
        return out

    op = doc["paths"]["/admin/v1/adapters/{adapter_id}/versions/{version}/quality-gate"]["post"]
    body = ref(op["requestBody"]["content"]["application/json"]["schema"])
    assert set(body["properties"]) == {"status", "details"} and body["required"] == ["status"]
    assert body.get("additionalProperties") is False
    assert set(body["properties"]["status"]["enum"]) == {"pending", "passed", "failed", "skipped"}
    assert {"200", "404", "422"} <= set(op["responses"])
    version = ref(op["responses"]["200"]["content"]["application/json"]["schema"])
    assert {"quality_gate", "quality_gate_details"} <= set(version["required"])

    promote = doc["paths"]["/admin/v1/adapters/{adapter_id}/versions/{version}/promote"]["post"]
    assert "409" in promote["responses"] and "quality_gate_pending" in promote["description"]
    promote_schema = json.dumps(promote["requestBody"]["content"]["application/json"]["schema"])
    assert "PromoteBody" in promote_schema
    assert set(schemas["PromoteBody"]["properties"]) == {"canary_weight", "force"}

    upload = doc["paths"]["/admin/v1/adapters/{adapter_id}/versions"]["post"]
    params = {p["name"]: p for p in upload["parameters"]}
    assert params["quality_gate"]["in"] == "query"
    content = upload["requestBody"]["content"]
    form = content["multipart/form-data"]["schema"]["properties"]
    assert form["quality_gate"]["enum"] == ["pending", "skipped"]
    source = content["application/json"]["schema"]
    assert set(source["properties"]) == {"source_uri", "quality_gate"}
