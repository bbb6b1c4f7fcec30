"""Approval before promote (SPEC §14): a maintainer requests, an approver approves, and the
promotion runs; self-approval refused; staleness; expiry; the quality gate checked again when the
request executes; distinct approvals; audit actors."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.registry.core_support import add_versions, make_settings, seed_adapter, statuses
from tests.registry.gov_support import V1, as_, error_of, gov_client_fixture, make_principal  # noqa: F401

A = f"{V1}/adapters/support"


def _team(admin: TestClient) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    maint = as_(make_principal(admin, "mia", "maintainer", ["team-a"]))
    appr = as_(make_principal(admin, "abe", "approver", ["team-a"]))
    appr2 = as_(make_principal(admin, "ada", "approver", ["team-a"]))
    return maint, appr, appr2


def test_two_person_promote(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    seed_adapter(admin)
    add_versions(factory, "support", 2)
    assert admin.post(f"{A}/versions/v1/promote").status_code == 200  # 0 approvals: at once
    assert (
        admin.patch(f"{V1}/base-models/demo-base", json={"approvals_required": 1}).json()[
            "approvals_required"
        ]
        == 1
    )
    maint, appr, _ = _team(admin)

    r = admin.post(f"{A}/versions/v2/promote", headers=maint)
    assert r.status_code == 202, r.text
    req = r.json()
    assert set(req) >= {"id", "adapter_id", "version", "canary_weight", "requested_by", "status", "approvals",
                        "created_at", "expires_at"}  # fmt: skip
    assert (req["status"], req["requested_by"], req["version"], req["approvals"]) == (
        "pending",
        "mia",
        "v2",
        [],
    )
    assert statuses(admin, "support")["active"] == "v1"  # nothing served changed

    error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=maint), 403, "forbidden")
    r = admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr, json={"comment": "lgtm"})
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["status"] == "executed" and [a["principal"] for a in done["approvals"]] == ["abe"]
    assert statuses(admin, "support")["active"] == "v2"
    assert admin.get(f"{V1}/promotions/{req['id']}").json()["status"] == "executed"
    error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr), 409, "promotion_not_pending")

    events = admin.get(f"{V1}/audit", params={"subject_id": "support", "limit": 500}).json()["data"]
    by_action = {e["action"]: e for e in events}
    assert by_action["promotion.requested"]["actor"] == "mia"
    assert by_action["promotion.approved"]["actor"] == "abe"
    assert by_action["promotion.approved"]["details"]["comment"] == "lgtm"
    assert by_action["promotion.executed"]["actor"] == "abe"
    promoted = [e for e in events if e["action"] == "version.promoted"][-1]
    assert promoted["actor"] == "abe" and promoted["details"]["promotion_id"] == req["id"]
    assert promoted["details"]["requested_by"] == "mia"


def test_self_approval_refused_even_for_admin(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    seed_adapter(admin)
    add_versions(factory, "support", 2)
    admin.post(f"{A}/versions/v1/promote")
    assert admin.patch(A, json={"approvals_required": 1}).status_code == 200
    req = admin.post(f"{A}/versions/v2/promote").json()
    assert req["requested_by"] == "bootstrap"
    err = error_of(admin.post(f"{V1}/promotions/{req['id']}/approve"), 403, "self_approval")
    assert "bootstrap" in err["message"]
    assert admin.get(f"{V1}/promotions/{req['id']}").json()["status"] == "pending"


def test_distinct_approvals_and_canary(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    seed_adapter(admin)
    add_versions(factory, "support", 2)
    admin.post(f"{A}/versions/v1/promote")
    admin.patch(A, json={"approvals_required": 2})
    maint, appr, appr2 = _team(admin)
    req = admin.post(f"{A}/versions/v2/promote", headers=maint, json={"canary_weight": 10}).json()
    assert (req["canary_weight"], req["approvals_required"]) == (10, 2)
    first = admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr).json()
    assert first["status"] == "pending" and statuses(admin, "support")["canary"] is None
    error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr), 409, "already_approved")
    second = admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr2).json()
    assert second["status"] == "executed"
    assert [a["principal"] for a in second["approvals"]] == ["abe", "ada"]
    st = statuses(admin, "support")
    assert (st["active"], st["canary"], st["weight"]) == ("v1", "v2", 10)


def test_duplicate_request_and_invalid_promotions_refused(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    seed_adapter(admin)
    add_versions(factory, "support", 2)
    admin.patch(A, json={"approvals_required": 1})
    # a request that could not run is refused at once, as the promote would be
    error_of(admin.post(f"{A}/versions/v2/promote", json={"canary_weight": 5}), 409, "no_active_version")
    error_of(admin.post(f"{A}/versions/v9/promote"), 404, "version_not_found")
    first = admin.post(f"{A}/versions/v1/promote")
    assert first.status_code == 202
    err = error_of(admin.post(f"{A}/versions/v1/promote"), 409, "promotion_already_requested")
    assert err["details"]["promotion_id"] == first.json()["id"]


def test_stale_request_answers_promotion_stale_on_approve_and_reject(
    gov_client: TestClient, factory: Any
) -> None:
    admin = gov_client
    seed_adapter(admin)
    add_versions(factory, "support", 3)
    admin.post(f"{A}/versions/v1/promote")
    admin.post(f"{A}/versions/v2/promote")
    admin.patch(A, json={"approvals_required": 1})
    maint, appr, _ = _team(admin)
    req = admin.post(f"{A}/versions/v3/promote", headers=maint).json()
    other = admin.post(f"{A}/versions/v3/promote", headers=maint, json={"canary_weight": 20}).json()
    assert admin.post(f"{A}/rollback").status_code == 200  # the active version changed
    assert admin.get(f"{V1}/promotions/{req['id']}").json()["status"] == "stale"
    err = error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr), 409, "promotion_stale")
    assert err["details"] == {"promotion_id": req["id"]}
    error_of(admin.post(f"{V1}/promotions/{req['id']}/reject", headers=appr), 409, "promotion_stale")
    assert admin.get(f"{V1}/promotions/{req['id']}").json()["status"] == "stale"  # not rejected
    stale = admin.get(f"{V1}/promotions", params={"status": "stale"}).json()["data"]
    assert {p["id"] for p in stale} == {req["id"], other["id"]}
    assert statuses(admin, "support")["active"] == "v1"
    # a version disabled after the request also makes it stale
    again = admin.post(f"{A}/versions/v3/promote", headers=maint).json()
    admin.post(f"{A}/versions/v3/disable")
    assert admin.get(f"{V1}/promotions/{again['id']}").json()["status"] == "stale"


def test_stale_detected_at_approval(gov_client: TestClient, factory: Any, engine: Engine) -> None:
    """A change made behind the API's back (not through the state machine) is still caught when
    approving: 409 promotion_stale, and the request is recorded stale."""
    import sqlalchemy as sa

    admin = gov_client
    seed_adapter(admin)
    add_versions(factory, "support", 2)
    admin.post(f"{A}/versions/v1/promote")
    admin.patch(A, json={"approvals_required": 1})
    maint, appr, _ = _team(admin)
    req = admin.post(f"{A}/versions/v2/promote", headers=maint).json()
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE versions SET status = 'retired' WHERE adapter_id = 'support' AND number = 2")
        )
    error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr), 409, "promotion_stale")
    assert admin.get(f"{V1}/promotions/{req['id']}").json()["status"] == "stale"


def test_expired_request(tmp_path: Path, db_url: str, engine: Engine, factory: Any) -> None:
    from datetime import datetime, timedelta

    import sqlalchemy as sa

    from registry.api import create_admin_app
    from tests.registry.core_support import AUTH
    from tests.registry.gov_support import _clear_principals

    _clear_principals(engine)
    app = create_admin_app(make_settings(tmp_path, db_url, promotion_ttl_s=3600), engine=engine)
    with TestClient(app, headers=AUTH) as admin:
        seed_adapter(admin)
        add_versions(factory, "support", 2)
        admin.post(f"{A}/versions/v1/promote")
        admin.patch(A, json={"approvals_required": 1})
        maint, appr, _ = _team(admin)
        req = admin.post(f"{A}/versions/v2/promote", headers=maint).json()
        ttl = datetime.fromisoformat(req["expires_at"]) - datetime.fromisoformat(req["created_at"])
        assert ttl == timedelta(seconds=3600)  # LORAPLANE_PROMOTION_TTL_S
        pending = admin.get(f"{V1}/promotions", params={"status": "pending"}).json()["data"]
        assert [p["id"] for p in pending] == [req["id"]]
        with engine.begin() as conn:  # an hour later
            past = datetime.now(UTC) - timedelta(seconds=1)
            conn.execute(sa.text("UPDATE promotion_requests SET expires_at = :t"), {"t": past})
        assert admin.get(f"{V1}/promotions/{req['id']}").json()["status"] == "expired"
        assert admin.get(f"{V1}/promotions", params={"status": "pending"}).json()["data"] == []
        expired = admin.get(f"{V1}/promotions", params={"status": "expired"}).json()["data"]
        assert [p["id"] for p in expired] == [req["id"]]
        error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr), 409, "promotion_expired")
        assert statuses(admin, "support")["active"] == "v1"
        # written as expired: a second approval says it is no longer pending
        again = admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr)
        error_of(again, 409, "promotion_not_pending")


def test_a_gate_changed_after_the_request_makes_it_stale(gov_client: TestClient, factory: Any) -> None:
    """SPEC §19: the version's gate is checked again at approval; a gate that changed since the
    request (passed → failed, here) makes it stale, answered 409 promotion_stale — even when it
    changes back, the approvers saw a request made against another gate."""
    admin = gov_client
    seed_adapter(admin)
    add_versions(factory, "support", 2)
    admin.post(f"{A}/versions/v1/promote")
    admin.patch(A, json={"approvals_required": 1})
    maint, appr, _ = _team(admin)
    gate = f"{A}/versions/v2/quality-gate"
    assert admin.post(gate, json={"status": "failed"}).status_code == 200
    error_of(admin.post(f"{A}/versions/v2/promote", headers=maint), 409, "quality_gate_failed")
    admin.post(gate, json={"status": "passed"})
    req = admin.post(f"{A}/versions/v2/promote", headers=maint).json()
    assert req["seen"] == {
        "active_version": "v1",
        "canary_version": None,
        "version_status": "ready",
        "quality_gate": "passed",
    }
    admin.post(gate, json={"status": "failed", "details": {"accuracy": 0.2}})  # the eval regressed
    assert admin.get(f"{V1}/promotions/{req['id']}").json()["status"] == "stale"  # at once
    error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr), 409, "promotion_stale")
    after = admin.get(f"{V1}/promotions/{req['id']}").json()
    assert (after["status"], after["approvals"], after["seen"]["quality_gate"]) == ("stale", [], "passed")
    assert statuses(admin, "support")["active"] == "v1"
    admin.post(gate, json={"status": "passed"})
    error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr), 409, "promotion_stale")
    # the same gate recorded again with other details is no change of gate: a new request stands
    again = admin.post(f"{A}/versions/v2/promote", headers=maint).json()
    admin.post(gate, json={"status": "passed", "details": {"accuracy": 0.95}})
    assert admin.post(f"{V1}/promotions/{again['id']}/approve", headers=appr).json()["status"] == "executed"


def test_reject_and_filters(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    seed_adapter(admin)
    seed_adapter(admin, "other")
    add_versions(factory, "support", 2)
    add_versions(factory, "other", 1)
    admin.post(f"{A}/versions/v1/promote")
    admin.patch(f"{V1}/base-models/demo-base", json={"approvals_required": 1})
    maint, appr, _ = _team(admin)
    req = admin.post(f"{A}/versions/v2/promote", headers=maint).json()
    other = admin.post(f"{V1}/adapters/other/versions/v1/promote", headers=maint).json()
    r = admin.post(f"{V1}/promotions/{req['id']}/reject", headers=appr, json={"comment": "not now"})
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["decided_by"], r.json()["comment"]) == ("rejected", "abe", "not now")
    params = {"action": "promotion.rejected", "subject_id": "support"}
    rejected = admin.get(f"{V1}/audit", params=params).json()["data"]
    assert [(e["actor"], e["subject_type"]) for e in rejected] == [("abe", "adapter")]
    assert rejected[0]["details"] == {"promotion_id": req["id"], "version": "v2", "comment": "not now"}
    error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr), 409, "promotion_not_pending")
    lst = admin.get(f"{V1}/promotions", params={"adapter_id": "other"}).json()["data"]
    assert [p["id"] for p in lst] == [other["id"]]
    assert [p["id"] for p in admin.get(f"{V1}/promotions", params={"status": "rejected"}).json()["data"]] == [
        req["id"]
    ]
    error_of(admin.get(f"{V1}/promotions", params={"status": "nope"}), 422, "invalid_request")
    error_of(admin.get(f"{V1}/promotions/pr-none"), 404, "promotion_not_found")
    # approvals_required validation
    error_of(admin.patch(A, json={"approvals_required": -1}), 422, "invalid_request")
    error_of(
        admin.patch(f"{V1}/base-models/demo-base", json={"approvals_required": "2"}), 422, "invalid_request"
    )
    assert admin.patch(A, json={"approvals_required": 0}).json()["approvals_required"] == 0
    assert admin.post(f"{A}/versions/v2/promote").status_code == 200  # the adapter's 0 wins
    assert admin.patch(A, json={"approvals_required": None}).json()["approvals_required"] is None


def test_raised_approvals_apply_to_pending_requests(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    seed_adapter(admin)
    add_versions(factory, "support", 2)
    admin.post(f"{A}/versions/v1/promote")
    admin.patch(A, json={"approvals_required": 1})
    maint, appr, appr2 = _team(admin)
    req = admin.post(f"{A}/versions/v2/promote", headers=maint).json()
    admin.patch(A, json={"approvals_required": 2})  # raised while the request waits
    first = admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr).json()
    assert (first["status"], first["approvals_required"]) == ("pending", 2)
    admin.patch(A, json={"approvals_required": 0})  # lowering it never skips approvals asked for
    assert admin.post(f"{V1}/promotions/{req['id']}/approve", headers=appr2).json()["status"] == "executed"


def test_maintainer_cannot_change_approvals_required(gov_client: TestClient) -> None:
    admin = gov_client
    seed_adapter(admin)
    maint, _, _ = _team(admin)
    err = error_of(admin.patch(A, headers=maint, json={"approvals_required": 0}), 403, "forbidden")
    assert err["details"] == {"permission": "adapter.approvals", "field": "approvals_required"}
    assert admin.patch(A, headers=maint, json={"description": "mine"}).status_code == 200
    error_of(
        admin.patch(f"{V1}/base-models/demo-base", headers=maint, json={"approvals_required": 0}),
        403,
        "forbidden",
    )
