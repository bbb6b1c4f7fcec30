"""Bulk rollback / disable / enable (SPEC §14): selectors, dry_run, a mix of adapters that can
and cannot roll back, one audit event per adapter with the shared bulk_id, maintainer scope."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.registry.core_support import add_versions, seed_adapter, statuses
from tests.registry.gov_support import V1, as_, error_of, gov_client_fixture, make_principal  # noqa: F401


def _fleet(admin: TestClient, factory: Any) -> None:
    """a1, a2: v2 active over v1 (can roll back); a3: only v1 (cannot); b1 of team-b: can."""
    for aid in ("a1", "a2", "a3"):
        seed_adapter(admin, aid)
    admin.post(f"{V1}/adapters", json={"id": "b1", "base_model": "demo-base", "owner": "team-b"})
    for aid in ("a1", "a2", "b1"):
        add_versions(factory, aid, 2)
        admin.post(f"{V1}/adapters/{aid}/versions/v1/promote")
        admin.post(f"{V1}/adapters/{aid}/versions/v2/promote")
    add_versions(factory, "a3", 1)
    admin.post(f"{V1}/adapters/a3/versions/v1/promote")


def test_bulk_rollback_mixed_with_dry_run_and_audit(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    _fleet(admin, factory)
    body: dict[str, Any] = {"selector": {"owner": "team-a"}, "dry_run": True, "reason": "bad eval data"}
    dry = admin.post(f"{V1}/bulk/rollback", json=body)
    assert dry.status_code == 200, dry.text
    d = dry.json()
    assert (d["dry_run"], d["applied"], d["failed"]) == (True, 2, 1)
    by_id = {r["adapter_id"]: r for r in d["results"]}
    assert set(by_id) == {"a1", "a2", "a3"}
    assert (by_id["a1"]["ok"], by_id["a1"]["from_version"], by_id["a1"]["to_version"]) == (True, "v2", "v1")
    assert by_id["a3"]["ok"] is False and by_id["a3"]["error"]["code"] == "no_rollback_target"
    assert by_id["a1"]["error"] is None
    # dry run: nothing changed, nothing audited
    assert [statuses(admin, a)["active"] for a in ("a1", "a2", "a3")] == ["v2", "v2", "v1"]
    assert admin.get(f"{V1}/audit", params={"action": "adapter.rolled_back"}).json()["data"] == []

    body["dry_run"] = False
    real = admin.post(f"{V1}/bulk/rollback", json=body).json()
    assert (real["dry_run"], real["applied"], real["failed"]) == (False, 2, 1)
    assert real["bulk_id"] != d["bulk_id"]
    assert [statuses(admin, a)["active"] for a in ("a1", "a2", "a3", "b1")] == ["v1", "v1", "v1", "v2"]
    events = admin.get(f"{V1}/audit", params={"action": "adapter.rolled_back"}).json()["data"]
    assert sorted(e["subject_id"] for e in events) == ["a1", "a2"]
    for e in events:
        assert e["actor"] == "bootstrap"
        assert e["details"]["bulk_id"] == real["bulk_id"] and e["details"]["reason"] == "bad eval data"


def test_bulk_disable_enable_selectors(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    _fleet(admin, factory)
    oper = as_(make_principal(admin, "ops", "operator"))
    r = admin.post(f"{V1}/bulk/disable", headers=oper, json={"selector": {"base_model": "demo-base"}}).json()
    assert (r["applied"], r["failed"]) == (4, 0)
    assert {x["adapter_id"]: (x["from_version"], x["to_version"]) for x in r["results"]}["a3"] == ("v1", None)
    assert {statuses(admin, a)["status"] for a in ("a1", "a2", "a3", "b1")} == {"disabled"}
    sel = {"adapters": ["a1", "nope", "b1", "a1"]}
    r = admin.post(f"{V1}/bulk/enable", headers=oper, json={"selector": sel, "reason": "all clear"}).json()
    assert [(x["adapter_id"], x["ok"]) for x in r["results"]] == [("a1", True), ("nope", False), ("b1", True)]
    assert r["results"][1]["error"]["code"] == "adapter_not_found"
    assert (r["results"][0]["from_version"], r["results"][0]["to_version"]) == (None, "v2")
    assert statuses(admin, "a1")["status"] == "active" and statuses(admin, "a2")["status"] == "disabled"
    events = admin.get(f"{V1}/audit", params={"action": "adapter.enabled"}).json()["data"]
    assert {e["actor"] for e in events} == {"ops"} and {e["details"]["bulk_id"] for e in events} == {
        r["bulk_id"]
    }
    # promoted_since: everything promoted in the last hour
    r = admin.post(
        f"{V1}/bulk/enable", headers=oper, json={"selector": {"promoted_since": "2000-01-01T00:00:00Z"}}
    ).json()
    assert sorted(x["adapter_id"] for x in r["results"]) == ["a1", "a2", "a3", "b1"]
    assert (
        admin.post(f"{V1}/bulk/enable", json={"selector": {"promoted_since": "2999-01-01T00:00:00"}}).json()[
            "results"
        ]
        == []
    )


def test_bulk_bad_selectors(gov_client: TestClient) -> None:
    admin = gov_client
    sel: dict[str, Any]
    for sel in ({}, {"owner": "x", "base_model": "y"}, {"adapters": []}, {"adapters": "a1"}, {"owner": ""},
                {"promoted_since": "yesterday"}, {"tag": "x"}):  # fmt: skip
        error_of(admin.post(f"{V1}/bulk/rollback", json={"selector": sel}), 422, "invalid_request")
    error_of(
        admin.post(f"{V1}/bulk/rollback", json={"selector": {"owner": "x"}, "extra": 1}),
        422,
        "invalid_request",
    )
    bad_json = admin.post(
        f"{V1}/bulk/rollback", content=b"{not json", headers={"content-type": "application/json"}
    )
    error_of(bad_json, 422, "invalid_request")


def test_bulk_maintainer_scope(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    _fleet(admin, factory)
    maint = as_(make_principal(admin, "mia", "maintainer", ["team-a"]))
    err = error_of(
        admin.post(f"{V1}/bulk/disable", headers=maint, json={"selector": {"base_model": "demo-base"}}),
        403,
        "forbidden",
    )
    assert "'team-b'" in err["message"] and err["details"]["permission"] == "adapter.disable"
    assert statuses(admin, "a1")["status"] == "active"  # nothing changed
    error_of(
        admin.post(f"{V1}/bulk/rollback", headers=maint, json={"selector": {"adapters": ["a1", "b1"]}}),
        403,
        "forbidden",
    )
    ok = admin.post(f"{V1}/bulk/rollback", headers=maint, json={"selector": {"owner": "team-a"}})
    assert ok.status_code == 200 and ok.json()["applied"] == 2
    viewer = as_(make_principal(admin, "vic", "viewer"))
    error_of(
        admin.post(f"{V1}/bulk/enable", headers=viewer, json={"selector": {"owner": "team-a"}}),
        403,
        "forbidden",
    )
