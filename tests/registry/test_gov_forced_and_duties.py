"""Forced promotions in plain sight and separation of duties (SPEC §14, §19; README "Governance"):

- a promotion request carries ``force`` in every answer and listing and in its
  ``promotion.requested`` event; forcing is ``adapter.force_promote`` (admin);
- a request whose version's gate changed since it was made is stale (the issue's reproduction:
  maintainer marks v2 passed, a forced request, gate set failed, an approver approves → v2 active
  with a failed gate; now 409 ``promotion_stale``);
- whoever recorded a version's quality gate by hand cannot approve its promotion (403
  ``gate_setter_approval``), so with approvals required a person who judged the version's quality
  is never the only person between it and ``active`` — also when the platform filed the request.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from kit.db import session_scope
from registry.services import gates, promotions
from tests.registry.core_support import add_versions, seed_adapter, statuses
from tests.registry.gov_support import V1, as_, error_of, gov_client_fixture, make_principal  # noqa: F401

A = f"{V1}/adapters/support"


def _setup(admin: TestClient, factory: Any) -> dict[str, dict[str, str]]:
    seed_adapter(admin)
    add_versions(factory, "support", 2)
    admin.post(f"{A}/versions/v1/promote")
    assert admin.patch(A, json={"approvals_required": 1}).status_code == 200
    return {
        "mia": as_(make_principal(admin, "mia", "maintainer", ["team-a"])),
        "abe": as_(make_principal(admin, "abe", "approver", ["team-a"])),
        "gia": as_(make_principal(admin, "gia", "admin")),
    }


def _requested(admin: TestClient, promotion_id: str) -> dict[str, Any]:
    events = admin.get(f"{V1}/audit", params={"action": "promotion.requested", "limit": 500}).json()["data"]
    [ev] = [e for e in events if e["details"]["promotion_id"] == promotion_id]
    return dict(ev["details"])


def test_forced_request_is_visible_everywhere_and_goes_stale_when_its_gate_changes(
    gov_client: TestClient, factory: Any
) -> None:
    admin = gov_client
    who = _setup(admin, factory)
    gate = f"{A}/versions/v2/quality-gate"
    assert admin.post(gate, headers=who["mia"], json={"status": "passed"}).status_code == 200
    # a maintainer may not force (the reproduction used a maintainer's force: true)
    err = error_of(
        admin.post(f"{A}/versions/v2/promote", headers=who["mia"], json={"force": True}), 403, "forbidden"
    )
    assert err["details"] == {"permission": "adapter.force_promote", "field": "force"}

    r = admin.post(f"{A}/versions/v2/promote", headers=who["gia"], json={"force": True})
    assert r.status_code == 202, r.text
    req = r.json()
    assert req["force"] is True and req["requested_by"] == "gia"
    assert admin.get(f"{V1}/promotions/{req['id']}").json()["force"] is True
    [listed] = admin.get(f"{V1}/promotions", params={"adapter_id": "support"}).json()["data"]
    assert (listed["id"], listed["force"]) == (req["id"], True)
    details = _requested(admin, req["id"])
    assert (details["force"], details["quality_gate"]) == (True, "passed")
    assert "forced_quality_gate" not in details  # the gate did not block when requested

    assert admin.post(gate, headers=who["mia"], json={"status": "failed"}).status_code == 200
    error_of(admin.post(f"{V1}/promotions/{req['id']}/approve", headers=who["abe"]), 409, "promotion_stale")
    st = statuses(admin, "support")
    assert st["active"] == "v1" and st["versions"]["v2"][0] == "ready"
    after = admin.get(f"{V1}/promotions/{req['id']}").json()
    assert (after["status"], after["force"], after["seen"]["quality_gate"]) == ("stale", True, "passed")


def test_a_force_past_a_failed_gate_is_recorded_and_shown_to_the_approver(
    gov_client: TestClient, factory: Any
) -> None:
    admin = gov_client
    who = _setup(admin, factory)
    admin.post(f"{A}/versions/v2/quality-gate", headers=who["mia"], json={"status": "failed"})
    plain = admin.post(f"{A}/versions/v1/promote", headers=who["mia"])  # not forced: force false
    error_of(plain, 409, "already_active")
    req = admin.post(f"{A}/versions/v2/promote", headers=who["gia"], json={"force": True}).json()
    details = _requested(admin, req["id"])
    assert (details["force"], details["quality_gate"], details["forced_quality_gate"]) == (
        True,
        "failed",
        "failed",
    )
    done = admin.post(f"{V1}/promotions/{req['id']}/approve", headers=who["abe"]).json()
    assert done["status"] == "executed" and done["force"] is True
    promoted = admin.get(f"{V1}/audit", params={"action": "version.promoted", "subject_id": "support"}).json()
    assert promoted["data"][-1]["details"]["forced_quality_gate"] == "failed"
    assert statuses(admin, "support")["active"] == "v2"


def test_a_request_without_force_says_so(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    who = _setup(admin, factory)
    req = admin.post(f"{A}/versions/v2/promote", headers=who["mia"]).json()
    assert req["force"] is False
    details = _requested(admin, req["id"])
    assert (details["force"], details["quality_gate"]) == (False, "skipped")


def test_the_hand_gate_setter_cannot_approve_that_versions_promotion(
    gov_client: TestClient, factory: Any
) -> None:
    admin = gov_client
    who = _setup(admin, factory)
    r = admin.post(f"{A}/versions/v2/quality-gate", headers=who["gia"], json={"status": "passed"})
    assert r.json()["quality_gate_by"] == "gia"
    req = admin.post(f"{A}/versions/v2/promote", headers=who["mia"]).json()
    err = error_of(
        admin.post(f"{V1}/promotions/{req['id']}/approve", headers=who["gia"]), 403, "gate_setter_approval"
    )
    assert err["details"] == {"quality_gate_by": "gia"} and "gia" in err["message"]
    assert admin.get(f"{V1}/promotions/{req['id']}").json()["approvals"] == []
    assert (
        admin.post(f"{V1}/promotions/{req['id']}/approve", headers=who["abe"]).json()["status"] == "executed"
    )


def test_a_platform_request_needs_a_person_other_than_the_hand_gate_setter(
    gov_client: TestClient, factory: Any
) -> None:
    """The canary analyser files a promotion request (no person behind it); the admin who marked
    the version passed by hand would otherwise be the only person to let it through."""
    admin = gov_client
    who = _setup(admin, factory)
    admin.post(f"{A}/versions/v2/quality-gate", headers=who["gia"], json={"status": "passed"})
    with session_scope(factory) as s:
        out = promotions.promote_or_request(
            s, "support", "v2", canary_weight=None, force=False, actor="canary-analyzer", ttl_s=3600
        )
    assert out.promotion is not None
    pid = out.promotion.id
    error_of(admin.post(f"{V1}/promotions/{pid}/approve", headers=who["gia"]), 403, "gate_setter_approval")
    assert admin.post(f"{V1}/promotions/{pid}/approve", headers=who["abe"]).json()["status"] == "executed"


def test_a_gate_the_evaluator_recorded_excludes_no_approver(gov_client: TestClient, factory: Any) -> None:
    admin = gov_client
    who = _setup(admin, factory)
    with session_scope(factory) as s:
        gates.set_quality_gate(s, "support", "v2", "passed", {"verdict": "pass"}, actor="evaluator")
    assert admin.get(f"{A}/versions/v2").json()["quality_gate_by"] == "evaluator"
    req = admin.post(f"{A}/versions/v2/promote", headers=who["mia"]).json()
    assert (
        admin.post(f"{V1}/promotions/{req['id']}/approve", headers=who["gia"]).json()["status"] == "executed"
    )
