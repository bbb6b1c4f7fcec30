"""State machine of SPEC §4 / §13 through the admin API, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.registry.core_support import (
    add_versions,
    seed_adapter,
    statuses,
)
from tests.registry.gov_support import error_of

A = "/admin/v1/adapters/support"


def _revision(c: TestClient, factory: Any) -> int:
    from kit.db import session_scope
    from registry.services.snapshot import current_revision

    with session_scope(factory) as s:
        return current_revision(s)


def test_promote_retires_previous_and_sets_rollback_to(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 3)
    r = client.post(f"{A}/versions/v1/promote")
    assert r.status_code == 200, r.text
    assert r.json()["active_version"] == "v1"
    client.post(f"{A}/versions/v2/promote")
    st = statuses(client, "support")
    assert st["active"] == "v2"
    assert st["versions"] == {"v1": ("retired", None), "v2": ("active", "v1"), "v3": ("ready", None)}
    # already active → 409; unknown version → 404; malformed version → 422
    assert client.post(f"{A}/versions/v2/promote").json()["error"]["code"] == "already_active"
    assert client.post(f"{A}/versions/v9/promote").status_code == 404
    r = client.post(f"{A}/versions/latest/promote")
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    assert client.post("/admin/v1/adapters/ghost/versions/v1/promote").json()["error"]["code"] == (
        "adapter_not_found"
    )


def test_canary_weight_replace_and_clear(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 4)
    # a canary needs an active version to split with
    r = client.post(f"{A}/versions/v2/promote", json={"canary_weight": 10})
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_active_version"
    client.post(f"{A}/versions/v1/promote")
    r = client.post(f"{A}/versions/v2/promote", json={"canary_weight": 10})
    assert r.status_code == 200
    st = statuses(client, "support")
    assert (st["active"], st["canary"], st["weight"]) == ("v1", "v2", 10)
    assert st["versions"]["v2"][0] == "canary"
    # change the weight of the same canary
    client.post(f"{A}/versions/v2/promote", json={"canary_weight": 30})
    assert statuses(client, "support")["weight"] == 30
    # a new canary replaces the old one, which returns to ready
    client.post(f"{A}/versions/v3/promote", json={"canary_weight": 5})
    st = statuses(client, "support")
    assert (st["canary"], st["weight"]) == ("v3", 5)
    assert st["versions"]["v2"][0] == "ready" and st["versions"]["v3"][0] == "canary"
    # a full promote of another version clears the canary (→ ready)
    client.post(f"{A}/versions/v4/promote")
    st = statuses(client, "support")
    assert (st["active"], st["canary"], st["weight"]) == ("v4", None, None)
    assert st["versions"]["v3"] == ("ready", None)
    assert st["versions"]["v4"] == ("active", "v1")
    assert st["versions"]["v1"][0] == "retired"
    # promoting the canary itself makes it active
    client.post(f"{A}/versions/v2/promote", json={"canary_weight": 50})
    client.post(f"{A}/versions/v2/promote")
    st = statuses(client, "support")
    assert (st["active"], st["canary"], st["weight"]) == ("v2", None, None)
    assert st["versions"]["v2"] == ("active", "v4")
    # weights outside 1..99 are refused
    for bad in (0, 100, -1, "10", 1.5, True):
        r = client.post(f"{A}/versions/v3/promote", json={"canary_weight": bad})
        assert r.status_code == 422, bad
        assert r.json()["error"]["code"] == "invalid_request"


def test_rollback_chain_skips_disabled_and_409_at_the_end(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 4)
    r = client.post(f"{A}/rollback")
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_rollback_target"
    for v in ("v1", "v2", "v3", "v4"):
        assert client.post(f"{A}/versions/{v}/promote").status_code == 200
    client.post(f"{A}/versions/v3/disable")  # retired v3 is now disabled: rollback skips it
    r = client.post(f"{A}/rollback")
    assert r.status_code == 200, r.text
    st = statuses(client, "support")
    assert st["active"] == "v2"
    assert st["versions"]["v4"][0] == "retired"
    assert st["versions"]["v3"][0] == "disabled"
    assert st["versions"]["v2"] == ("active", "v1")  # keeps its own rollback_to
    client.post(f"{A}/rollback")
    assert statuses(client, "support")["active"] == "v1"
    r = client.post(f"{A}/rollback")
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_rollback_target"
    assert statuses(client, "support")["active"] == "v1"


def test_rollback_during_a_canary_drops_the_canary_and_keeps_the_active_version(
    client: TestClient, factory: Any
) -> None:
    """SPEC §19: with v2 active and a v3 canary, rollback ends the canary and v2 stays (it used to
    drop v2 as well); the next rollback steps back along rollback_to as before."""
    seed_adapter(client)
    add_versions(factory, "support", 3)
    client.post(f"{A}/versions/v1/promote")
    client.post(f"{A}/versions/v2/promote")
    client.post(f"{A}/versions/v3/promote", json={"canary_weight": 20})
    r = client.post(f"{A}/rollback")
    assert r.status_code == 200, r.text
    st = statuses(client, "support")
    assert (st["active"], st["canary"], st["weight"]) == ("v2", None, None)
    assert st["versions"] == {"v1": ("retired", None), "v2": ("active", "v1"), "v3": ("ready", None)}
    [ev] = client.get("/admin/v1/audit", params={"action": "adapter.rolled_back"}).json()["data"]
    assert ev["details"] == {"version": "v2", "from": "v3", "canary_cleared": "v3"}
    assert client.post(f"{A}/rollback").status_code == 200  # no canary now: back along rollback_to
    st = statuses(client, "support")
    assert (st["active"], st["canary"]) == ("v1", None)


def test_rollback_of_a_canary_on_the_first_active_version_keeps_it(client: TestClient, factory: Any) -> None:
    """The issue's case: v1 active (nothing to roll back to) with a v2 canary answered 409
    no_rollback_target; now the canary ends and v1 stays."""
    seed_adapter(client)
    add_versions(factory, "support", 2)
    client.post(f"{A}/versions/v1/promote")
    client.post(f"{A}/versions/v2/promote", json={"canary_weight": 10})
    r = client.post(f"{A}/rollback")
    assert r.status_code == 200, r.text
    assert (r.json()["active_version"], r.json()["canary_version"]) == ("v1", None)
    error_of(client.post(f"{A}/rollback"), 409, "no_rollback_target")  # and then there is nothing left


def test_end_canary_clears_it_keeps_active_and_is_idempotent(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 3)
    client.post(f"{A}/versions/v1/promote")
    client.post(f"{A}/versions/v2/promote")
    client.post(f"{A}/versions/v3/promote", json={"canary_weight": 25})
    r = client.delete(f"{A}/canary")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["id"], body["active_version"], body["canary_version"], body["canary_weight"]) == (
        "support",
        "v2",
        None,
        None,
    )
    assert {v["version"]: v["status"] for v in body["versions"]} == {
        "v1": "retired",
        "v2": "active",
        "v3": "ready",
    }
    [ev] = client.get("/admin/v1/audit", params={"action": "version.canary_cleared"}).json()["data"]
    assert (ev["subject_id"], ev["details"]) == (
        "support",
        {"version": "v3", "canary_weight": 25, "active_version": "v2"},
    )
    again = client.delete(f"{A}/canary")  # none left: 200, the same record, no second event
    assert again.status_code == 200 and again.json()["active_version"] == "v2"
    assert len(client.get("/admin/v1/audit", params={"action": "version.canary_cleared"}).json()["data"]) == 1
    error_of(client.delete("/admin/v1/adapters/nope/canary"), 404, "adapter_not_found")


def test_enable_version_takes_a_disabled_version_back_to_ready(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 2)
    client.post(f"{A}/versions/v1/promote")
    client.post(f"{A}/versions/v2/quality-gate", json={"status": "passed", "details": {"acc": 0.9}})
    client.post(f"{A}/versions/v2/disable")
    r = client.post(f"{A}/versions/v2/enable")
    assert r.status_code == 200, r.text
    v2 = client.get(f"{A}/versions/v2").json()
    assert (v2["status"], v2["quality_gate"], v2["quality_gate_details"]) == ("ready", "passed", {"acc": 0.9})
    [ev] = client.get("/admin/v1/audit", params={"action": "version.enabled"}).json()["data"]
    assert ev["details"] == {"version": "v2", "quality_gate": "passed"}
    assert client.post(f"{A}/versions/v2/promote").status_code == 200  # promotable again
    err = error_of(client.post(f"{A}/versions/v2/enable"), 409, "conflict")  # active, not disabled
    assert err["details"] == {"version": "v2", "status": "active"}
    error_of(client.post(f"{A}/versions/v9/enable"), 404, "version_not_found")


def test_disabling_the_active_version_writes_a_rollback_event_too(client: TestClient, factory: Any) -> None:
    """SPEC §19: an audit filter on adapter.rolled_back finds the rollback a disable caused."""
    seed_adapter(client)
    add_versions(factory, "support", 2)
    client.post(f"{A}/versions/v1/promote")
    client.post(f"{A}/versions/v2/promote")
    client.post(f"{A}/versions/v2/disable")
    [ev] = client.get("/admin/v1/audit", params={"action": "adapter.rolled_back"}).json()["data"]
    assert (ev["subject_id"], ev["actor"]) == ("support", "bootstrap")
    assert ev["details"] == {
        "version": "v1",
        "from": "v2",
        "canary_cleared": None,
        "cause": "version.disabled",
    }
    [dis] = client.get("/admin/v1/audit", params={"action": "version.disabled"}).json()["data"]
    assert dis["details"]["rolled_back_to"] == "v1"
    # nothing to roll back to: the adapter is left without an active version, and no rollback event
    client.post(f"{A}/versions/v1/disable")
    assert len(client.get("/admin/v1/audit", params={"action": "adapter.rolled_back"}).json()["data"]) == 1


def test_adapter_kill_switch_restores_previous_state(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 2)
    client.post(f"{A}/versions/v1/promote")
    client.post(f"{A}/versions/v2/promote", json={"canary_weight": 15})
    r = client.post(f"{A}/disable")
    assert r.status_code == 200 and r.json()["status"] == "disabled"
    assert (
        client.get("/admin/v1/adapters", params={"status": "disabled"}).json()["data"][0]["id"] == "support"
    )
    r = client.post(f"{A}/enable")
    assert r.status_code == 200
    st = statuses(client, "support")
    assert (st["status"], st["active"], st["canary"], st["weight"]) == ("active", "v1", "v2", 15)
    # idempotent: enabling an enabled adapter changes nothing and writes no event
    n = len(client.get("/admin/v1/audit", params={"action": "adapter.enabled"}).json()["data"])
    client.post(f"{A}/enable")
    assert len(client.get("/admin/v1/audit", params={"action": "adapter.enabled"}).json()["data"]) == n == 1


def test_disable_version_active_canary_and_promote_refused(client: TestClient, factory: Any) -> None:
    seed_adapter(client)
    add_versions(factory, "support", 4)
    client.post(f"{A}/versions/v1/promote")
    client.post(f"{A}/versions/v2/promote")
    client.post(f"{A}/versions/v3/promote", json={"canary_weight": 10})
    # disabling the canary clears it
    r = client.post(f"{A}/versions/v3/disable")
    assert r.status_code == 200
    st = statuses(client, "support")
    assert (st["active"], st["canary"], st["weight"]) == ("v2", None, None)
    assert st["versions"]["v3"][0] == "disabled"
    # a disabled version cannot be promoted, nor made a canary
    assert client.post(f"{A}/versions/v3/promote").json()["error"]["code"] == "version_disabled"
    assert client.post(f"{A}/versions/v3/promote", json={"canary_weight": 5}).status_code == 409
    # disabling the active version rolls back (and clears a canary)
    client.post(f"{A}/versions/v4/promote", json={"canary_weight": 10})
    r = client.post(f"{A}/versions/v2/disable")
    st = statuses(client, "support")
    assert (st["active"], st["canary"]) == ("v1", None)
    assert st["versions"]["v2"][0] == "disabled" and st["versions"]["v4"][0] == "ready"
    ev = client.get("/admin/v1/audit", params={"action": "version.disabled"}).json()["data"]
    assert ev[-1]["details"]["rolled_back_to"] == "v1" and ev[-1]["details"]["version"] == "v2"
    # nothing left to roll back to: no active version, no canary
    client.post(f"{A}/versions/v4/promote", json={"canary_weight": 10})
    client.post(f"{A}/versions/v1/disable")
    st = statuses(client, "support")
    assert (st["active"], st["canary"], st["weight"]) == (None, None, None)
    assert st["versions"]["v4"][0] == "ready"
    # disabling twice is a no-op
    assert client.post(f"{A}/versions/v1/disable").status_code == 200
    assert len(client.get("/admin/v1/audit", params={"action": "version.disabled"}).json()["data"]) == 3
    # a ready version can be promoted again afterwards
    client.post(f"{A}/versions/v4/promote")
    assert statuses(client, "support")["versions"]["v4"] == ("active", None)


def test_every_change_bumps_revision_once_and_failures_do_not(client: TestClient, factory: Any) -> None:
    r0 = _revision(client, factory)
    seed_adapter(client)  # base model + adapter
    assert _revision(client, factory) == r0 + 2
    add_versions(factory, "support", 2)
    assert _revision(client, factory) == r0 + 4
    client.post(f"{A}/versions/v1/promote")
    assert _revision(client, factory) == r0 + 5
    events = len(client.get("/admin/v1/audit", params={"limit": 500}).json()["data"])
    # refused changes: no revision bump, no audit row
    assert client.post(f"{A}/versions/v1/promote").status_code == 409
    assert client.post("/admin/v1/adapters/ghost/rollback").status_code == 404
    assert client.post(f"{A}/rollback").status_code == 409
    assert _revision(client, factory) == r0 + 5
    assert len(client.get("/admin/v1/audit", params={"limit": 500}).json()["data"]) == events
