"""Principals and tokens (SPEC §14): create, list, describe, change, tokens shown once and
revocable, /whoami, the bootstrap principal, clear errors for bad input, audit."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from tests.registry.gov_support import V1, as_, error_of, gov_client_fixture, make_principal  # noqa: F401


def test_principal_lifecycle(gov_client: TestClient, engine: Engine) -> None:
    admin = gov_client
    assert admin.get(f"{V1}/whoami").json() == {
        "id": "bootstrap", "role": "admin", "owners": [], "created_by": None, "created_at": None,
    }  # fmt: skip
    r = admin.post(
        f"{V1}/principals", json={"id": "mia", "role": "maintainer", "owners": ["team-b", "team-a"]}
    )
    assert r.status_code == 201, r.text
    assert (r.json()["owners"], r.json()["created_by"]) == (["team-a", "team-b"], "bootstrap")
    issued = admin.post(f"{V1}/principals/mia/tokens").json()
    assert set(issued) == {"token_id", "token", "prefix", "created_at"}
    token = issued["token"]
    assert token.startswith("lpa-") and issued["prefix"] == token[:12]
    me = admin.get(f"{V1}/whoami", headers=as_(token)).json()
    assert (me["id"], me["role"], me["owners"]) == ("mia", "maintainer", ["team-a", "team-b"])

    # the token is never shown again, and only its hash is stored
    shown = admin.get(f"{V1}/principals/mia").json()
    assert [t["prefix"] for t in shown["tokens"]] == [issued["prefix"]] and token not in str(shown)
    assert token not in str(admin.get(f"{V1}/principals").json())
    assert token not in str(admin.get(f"{V1}/audit", params={"limit": 500}).json())
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash FROM principal_tokens")).scalars().all()
    assert stored and all(token not in h for h in stored)

    # role and owners change, effective on the next call
    r = admin.patch(f"{V1}/principals/mia", json={"role": "approver"})
    assert (r.json()["role"], r.json()["owners"]) == ("approver", ["team-a", "team-b"])
    assert admin.get(f"{V1}/whoami", headers=as_(token)).json()["role"] == "approver"
    r = admin.patch(f"{V1}/principals/mia", json={"role": "operator"})
    assert (r.json()["role"], r.json()["owners"]) == ("operator", [])  # owners do not apply

    # a second token; revoking one leaves the other working
    second = admin.post(f"{V1}/principals/mia/tokens").json()
    r = admin.delete(f"{V1}/principals/mia/tokens/{issued['token_id']}")
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    error_of(admin.get(f"{V1}/whoami", headers=as_(token)), 401, "unauthorized")
    assert admin.get(f"{V1}/whoami", headers=as_(second["token"])).json()["id"] == "mia"
    error_of(admin.delete(f"{V1}/principals/mia/tokens/nope"), 404, "token_not_found")

    actions = [
        e["action"] for e in admin.get(f"{V1}/audit", params={"subject_type": "principal"}).json()["data"]
    ]
    assert actions == ["principal.created", "token.issued", "principal.updated", "principal.updated",
                       "token.issued", "token.revoked"]  # fmt: skip


def test_principal_input_errors(gov_client: TestClient) -> None:
    admin = gov_client
    P = f"{V1}/principals"
    error_of(admin.post(P, json={"id": "x", "role": "root"}), 422, "invalid_request")
    error_of(admin.post(P, json={"id": "Bad Id", "role": "viewer"}), 422, "invalid_request")
    error_of(admin.post(P, json={"id": "bootstrap", "role": "admin"}), 422, "invalid_request")
    error_of(admin.post(P, json={"id": "router", "role": "viewer"}), 422, "invalid_request")
    error_of(admin.post(P, json={"id": "v", "role": "viewer", "owners": ["team-a"]}), 422, "invalid_request")
    error_of(admin.post(P, json={"id": "m", "role": "maintainer", "owners": [""]}), 422, "invalid_request")
    assert admin.post(P, json={"id": "v", "role": "viewer"}).status_code == 201
    error_of(admin.post(P, json={"id": "v", "role": "viewer"}), 409, "principal_exists")
    error_of(admin.patch(f"{P}/v", json={"role": None}), 422, "invalid_request")
    error_of(admin.patch(f"{P}/v", json={"owners": ["team-a"]}), 422, "invalid_request")
    error_of(admin.patch(f"{P}/nope", json={"role": "viewer"}), 404, "principal_not_found")
    error_of(admin.post(f"{P}/nope/tokens"), 404, "principal_not_found")
    error_of(admin.get(f"{P}/nope"), 404, "principal_not_found")
    page = admin.get(P, params={"limit": 1}).json()
    assert [p["id"] for p in page["data"]] == ["v"] and page["next_cursor"] is None


def test_audit_actor_is_the_principal(gov_client: TestClient, factory: Any) -> None:
    from tests.registry.core_support import add_versions, seed_adapter

    admin = gov_client
    seed_adapter(admin)
    add_versions(factory, "support", 2)
    maint = as_(make_principal(admin, "mia", "maintainer", ["team-a"]))
    oper = as_(make_principal(admin, "ops", "operator"))
    assert admin.post(f"{V1}/adapters/support/versions/v1/promote", headers=maint).status_code == 200
    assert admin.post(f"{V1}/adapters/support/versions/v2/promote", headers=maint).status_code == 200
    assert admin.post(f"{V1}/adapters/support/rollback", headers=oper).status_code == 200
    assert admin.post(f"{V1}/adapters/support/disable", headers=oper).status_code == 200
    events = admin.get(f"{V1}/audit", params={"subject_id": "support"}).json()["data"]
    actors = {(e["action"], e["actor"]) for e in events}
    assert {
        ("version.promoted", "mia"),
        ("adapter.rolled_back", "ops"),
        ("adapter.disabled", "ops"),
    } <= actors
    assert ("adapter.created", "bootstrap") in actors
