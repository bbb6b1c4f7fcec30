"""The role matrix of SPEC §14, written out here from the SPEC (not from the code): every admin
route × every role is allowed or 403 ``forbidden`` naming the missing permission; maintainers
and approvers only for adapters of their owners; tenant keys and unknown or revoked tokens are
401 everywhere; a route that declares no permission is admin-only; the README's table matches the
routes' declarations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, Depends
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from registry.demo import demo_base_model
from tests.registry.core_support import AUTH, add_versions, make_settings, seed_adapter
from tests.registry.gov_support import V1, as_, error_of, gov_client_fixture, make_principal  # noqa: F401

ROLES = ("viewer", "maintainer", "approver", "operator", "admin")
READ = dict.fromkeys(ROLES, "yes")
ADMIN = {"viewer": "no", "maintainer": "no", "approver": "no", "operator": "no", "admin": "yes"}
MAINTAIN = {"viewer": "no", "maintainer": "own", "approver": "no", "operator": "no", "admin": "yes"}
EMERGENCY = {"viewer": "no", "maintainer": "own", "approver": "no", "operator": "yes", "admin": "yes"}
APPROVE = {"viewer": "no", "maintainer": "no", "approver": "own", "operator": "no", "admin": "yes"}

# (method, path) → who may call it (SPEC §14's table): yes / own (in scope only) / no.
MATRIX: dict[tuple[str, str], dict[str, str]] = {
    ("POST", "/base-models"): ADMIN,
    ("GET", "/base-models"): READ,
    ("GET", "/base-models/{name}"): READ,
    ("PATCH", "/base-models/{name}"): ADMIN,
    ("POST", "/adapters"): MAINTAIN,
    ("PATCH", "/adapters/{adapter_id}"): MAINTAIN,
    ("GET", "/adapters"): READ,
    ("GET", "/adapters/{adapter_id}"): READ,
    ("GET", "/adapters/{adapter_id}/versions"): READ,
    ("GET", "/adapters/{adapter_id}/versions/{version}"): READ,
    ("POST", "/adapters/{adapter_id}/versions"): MAINTAIN,
    ("POST", "/adapters/{adapter_id}/versions/{version}/promote"): MAINTAIN,
    ("POST", "/adapters/{adapter_id}/versions/{version}/quality-gate"): MAINTAIN,
    ("POST", "/adapters/{adapter_id}/rollback"): EMERGENCY,
    ("POST", "/adapters/{adapter_id}/disable"): EMERGENCY,
    ("POST", "/adapters/{adapter_id}/enable"): EMERGENCY,
    ("POST", "/adapters/{adapter_id}/versions/{version}/disable"): EMERGENCY,
    # SPEC §19: ending a canary is the rollback's permission; re-enabling a version undoes a disable
    ("DELETE", "/adapters/{adapter_id}/canary"): EMERGENCY,
    ("POST", "/adapters/{adapter_id}/versions/{version}/enable"): EMERGENCY,
    ("POST", "/adapters/{adapter_id}/prewarm"): MAINTAIN,
    ("POST", "/tenants"): ADMIN,
    ("GET", "/tenants"): READ,
    ("GET", "/tenants/{tenant_id}"): READ,
    ("PATCH", "/tenants/{tenant_id}"): ADMIN,
    ("POST", "/tenants/{tenant_id}/keys"): ADMIN,
    ("DELETE", "/tenants/{tenant_id}/keys/{key_id}"): ADMIN,
    ("PUT", "/tenants/{tenant_id}/grants/{adapter_id}"): ADMIN,
    ("DELETE", "/tenants/{tenant_id}/grants/{adapter_id}"): ADMIN,
    ("GET", "/owners/{owner}"): READ,
    ("PUT", "/owners/{owner}/limits"): ADMIN,
    ("GET", "/audit"): READ,
    ("GET", "/replicas"): READ,
    ("GET", "/replicas/plan"): READ,
    ("GET", "/whoami"): READ,
    ("POST", "/principals"): ADMIN,
    ("GET", "/principals"): READ,
    ("GET", "/principals/{principal_id}"): READ,
    ("PATCH", "/principals/{principal_id}"): ADMIN,
    ("POST", "/principals/{principal_id}/tokens"): ADMIN,
    ("DELETE", "/principals/{principal_id}/tokens/{token_id}"): ADMIN,
    ("GET", "/promotions"): READ,
    ("GET", "/promotions/{promotion_id}"): READ,
    ("POST", "/promotions/{promotion_id}/approve"): APPROVE,
    ("POST", "/promotions/{promotion_id}/reject"): APPROVE,
    ("POST", "/bulk/rollback"): EMERGENCY,
    ("POST", "/bulk/disable"): EMERGENCY,
    ("POST", "/bulk/enable"): EMERGENCY,
    # quality (SPEC §16): sets and policies change how an adapter is judged (adapter.update)
    ("PUT", "/adapters/{adapter_id}/regression-set"): MAINTAIN,
    ("GET", "/adapters/{adapter_id}/regression-set"): READ,
    ("PUT", "/adapters/{adapter_id}/quality-policy"): MAINTAIN,
    ("GET", "/adapters/{adapter_id}/quality-policy"): READ,
    ("POST", "/adapters/{adapter_id}/versions/{version}/evaluations"): MAINTAIN,
    ("GET", "/adapters/{adapter_id}/versions/{version}/evaluations"): READ,
    ("GET", "/adapters/{adapter_id}/versions/{version}/evaluations/{eval_id}"): READ,
    ("GET", "/adapters/{adapter_id}/evaluations"): READ,
}


def _body(method: str, path: str, role: str) -> Any:
    bodies: dict[tuple[str, str], Any] = {
        ("POST", "/base-models"): demo_base_model(f"b-{role}"),
        ("PATCH", "/base-models/{name}"): {"approvals_required": 0},
        ("POST", "/adapters"): {"id": f"new-{role}", "base_model": "demo-base", "owner": "team-a"},
        ("PATCH", "/adapters/{adapter_id}"): {"description": f"by {role}"},
        ("POST", "/adapters/{adapter_id}/versions"): {"source_uri": "s3://not-allowed/x/"},
        ("POST", "/adapters/{adapter_id}/versions/{version}/promote"): {"canary_weight": 10},
        ("POST", "/adapters/{adapter_id}/versions/{version}/quality-gate"): {"status": "passed"},
        ("POST", "/adapters/{adapter_id}/prewarm"): {"replicas": 1},
        ("POST", "/tenants"): {"id": f"t-{role}"},
        ("PATCH", "/tenants/{tenant_id}"): {"name": role},
        ("PUT", "/tenants/{tenant_id}/grants/{adapter_id}"): {},
        ("PUT", "/owners/{owner}/limits"): {"rpm": 100},
        ("POST", "/principals"): {"id": f"p-{role}", "role": "viewer"},
        ("PATCH", "/principals/{principal_id}"): {"role": "viewer"},
    }
    if path.startswith("/bulk/"):
        return {"selector": {"adapters": ["support"]}, "dry_run": True, "reason": "matrix"}
    return bodies.get((method, path))


def _url(path: str, promotion_id: str) -> str:
    values = {
        "adapter_id": "support", "version": "v9", "name": "demo-base", "tenant_id": "acme",
        "key_id": "no-such-key", "owner": "team-a", "principal_id": "someone", "token_id": "no-such-token",
        "promotion_id": promotion_id, "eval_id": "ev_none",
    }  # fmt: skip
    if path.endswith("/promote") or path.endswith("/quality-gate"):
        values["version"] = "v2"
    return V1 + path.format(**values)


def _call(c: TestClient, method: str, path: str, headers: dict[str, str], role: str, pid: str) -> Any:
    return c.request(method, _url(path, pid), headers=headers, json=_body(method, path, role))


@pytest.fixture
def world(gov_client: TestClient, factory: Any) -> dict[str, Any]:
    admin = gov_client
    seed_adapter(admin)
    seed_adapter(admin, "gated")
    add_versions(factory, "support", 2)
    add_versions(factory, "gated", 2)
    admin.post(f"{V1}/adapters/support/versions/v1/promote")
    admin.post(f"{V1}/adapters/gated/versions/v1/promote")
    admin.patch(f"{V1}/adapters/gated", json={"approvals_required": 1})
    assert admin.post(f"{V1}/tenants", json={"id": "acme"}).status_code == 201
    key = admin.post(f"{V1}/tenants/acme/keys").json()["key"]
    make_principal(admin, "someone", "viewer")
    requester = as_(make_principal(admin, "req", "maintainer", ["team-a"]))
    pid = admin.post(f"{V1}/adapters/gated/versions/v2/promote", headers=requester).json()["id"]
    tokens = {
        r: as_(make_principal(admin, f"in-{r}", r, ["team-a"] if r in ("maintainer", "approver") else []))
        for r in ROLES
    }
    outside = {r: as_(make_principal(admin, f"out-{r}", r, ["team-b"])) for r in ("maintainer", "approver")}
    return {"tokens": tokens, "outside": outside, "promotion": pid, "tenant_key": key}


def test_every_admin_route_is_in_the_matrix() -> None:
    from registry.api.app import ADMIN_ROUTERS, PREFIX
    from registry.auth.dependencies import route_rules

    declared = {(r.method, r.path[len(PREFIX) :]) for r in route_rules(ADMIN_ROUTERS, PREFIX)}
    assert declared == set(MATRIX)
    undeclared = [r for r in route_rules(ADMIN_ROUTERS, PREFIX) if r.requirement is None]
    assert undeclared == []


def test_role_matrix(gov_client: TestClient, world: dict[str, Any]) -> None:
    c = gov_client
    pid = world["promotion"]
    for (method, path), who in MATRIX.items():
        for role in ROLES:
            r = _call(c, method, path, world["tokens"][role], role, pid)
            if who[role] == "no":
                err = error_of(r, 403, "forbidden")
                assert err["details"]["permission"] in err["message"], (method, path, role, err)
            else:
                assert r.status_code not in (401, 403), (method, path, role, r.text)
            if who[role] == "own":
                r = _call(c, method, path, world["outside"][role], f"out-{role}", pid)
                err = error_of(r, 403, "forbidden")
                assert "'team-a'" in err["message"] and err["details"]["owner"] == "team-a", (
                    method,
                    path,
                    err,
                )


def test_forcing_a_promotion_past_its_gate_needs_its_own_permission(
    gov_client: TestClient, world: dict[str, Any]
) -> None:
    """SPEC §19: ``force: true`` is ``adapter.force_promote``, which only admin holds; a maintainer
    may promote its own adapter, not force it."""
    c = gov_client
    assert (
        c.post(f"{V1}/adapters/support/versions/v2/quality-gate", json={"status": "failed"}).status_code
        == 200
    )
    url = f"{V1}/adapters/support/versions/v2/promote"
    for role in ROLES[:-1]:  # all but admin
        r = c.post(url, headers=world["tokens"][role], json={"force": True})
        err = error_of(r, 403, "forbidden")
        assert err["details"]["permission"] in ("adapter.force_promote", "adapter.promote"), err
        if role == "maintainer":
            assert err["details"] == {"permission": "adapter.force_promote", "field": "force"}
            # the same promote without force reaches the gate (409), so the refusal above was the force
            error_of(c.post(url, headers=world["tokens"][role]), 409, "quality_gate_failed")
            error_of(
                c.post(url, headers=world["tokens"][role], json={"force": False}), 409, "quality_gate_failed"
            )
    r = c.post(url, headers=world["tokens"]["admin"], json={"force": True})
    assert r.status_code == 200, r.text
    forced = c.get(f"{V1}/audit", params={"action": "version.promoted", "subject_id": "support"}).json()[
        "data"
    ]
    assert forced[-1]["details"]["forced_quality_gate"] == "failed" and forced[-1]["actor"] == "in-admin"


def test_tenant_keys_and_bad_tokens_are_refused_everywhere(
    gov_client: TestClient, world: dict[str, Any]
) -> None:
    c = gov_client
    revoked = make_principal(c, "gone", "admin")
    token_id = c.get(f"{V1}/principals/gone").json()["tokens"][0]["token_id"]
    assert c.delete(f"{V1}/principals/gone/tokens/{token_id}").status_code == 200
    for bad in (world["tenant_key"], revoked, "lpa-" + "x" * 43, "admin-token-for-tests-0123456789x"):
        for method, path in MATRIX:
            r = _call(c, method, path, as_(bad), "x", world["promotion"])
            error_of(r, 401, "unauthorized")
    for method, path in MATRIX:
        r = c.request(method, _url(path, world["promotion"]), headers={"Authorization": ""})
        error_of(r, 401, "unauthorized")


def test_undeclared_route_is_admin_only(tmp_path: Path, db_url: str, engine: Engine) -> None:
    from registry.api import create_admin_app
    from registry.api.app import PREFIX
    from registry.auth.dependencies import guard
    from tests.registry.gov_support import _clear_principals

    _clear_principals(engine)
    app = create_admin_app(make_settings(tmp_path, db_url), engine=engine)
    extra = APIRouter()

    @extra.get("/undeclared")
    def undeclared() -> dict[str, str]:
        return {"ok": "yes"}

    app.include_router(extra, prefix=PREFIX, dependencies=[Depends(guard)])
    with TestClient(app, headers=AUTH) as c:
        viewer = as_(make_principal(c, "v", "viewer"))
        operator = as_(make_principal(c, "o", "operator"))
        assert c.get(f"{V1}/undeclared").json() == {"ok": "yes"}
        error_of(c.get(f"{V1}/undeclared", headers=viewer), 403, "forbidden")
        error_of(c.get(f"{V1}/undeclared", headers=operator), 403, "forbidden")
        error_of(c.get(f"{V1}/undeclared", headers={"Authorization": "Bearer nope"}), 401, "unauthorized")


def test_readme_permission_table_matches_the_routes() -> None:
    from registry.api.permissions_doc import readme_with_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert readme_with_table(readme) == readme, (
        "run: python -m registry.api.permissions_doc --write README.md"
    )
