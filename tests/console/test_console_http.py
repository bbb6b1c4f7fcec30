"""The console over HTTP (in-process, on a real SQLite registry): sign-in, cookies, CSRF, security
headers, previews that commit nothing, clear errors for bad input — and page times with 1,000
adapters and 50 replicas (``slow``; the benchmark is ``benchmarks/console.py``)."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from benchmarks.console import PAGES, TOKEN, build_app
from kit.db import session_scope
from registry.api.deps import AdminState
from registry.console.session import SessionCodec
from registry.services import adapters as adapter_svc
from registry.services import audit as audit_svc
from registry.services import principals as principal_svc
from registry.services import tenants as tenant_svc

CONSOLE = "/admin/ui"


def _app(tmp_path: Path, adapters: int = 12, replicas: int = 3) -> FastAPI:
    return build_app(f"sqlite:///{tmp_path}/registry.db", tmp_path, replicas=replicas, adapters=adapters)


def _sign_in(client: TestClient, token: str = TOKEN) -> TestClient:
    page = client.get(f"{CONSOLE}/signin")
    pre = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert pre is not None
    r = client.post(f"{CONSOLE}/signin", data={"csrf": pre.group(1), "token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return client


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m is not None
    return m.group(1)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return _app(tmp_path_factory.mktemp("console-http"))


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def test_sign_in_sets_a_signed_http_only_strict_cookie(client: TestClient) -> None:
    r = client.get(f"{CONSOLE}/adapters?owner=team-1", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == f"{CONSOLE}/signin?next=%2Fadmin%2Fui%2Fadapters%3Fowner%3Dteam-1"
    page = client.get(r.headers["location"])
    pre = _csrf(page.text)
    r = client.post(
        f"{CONSOLE}/signin",
        data={"csrf": pre, "token": TOKEN, "next": f"{CONSOLE}/adapters?owner=team-1"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == f"{CONSOLE}/adapters?owner=team-1"
    cookie = next(v for k, v in r.headers.multi_items() if k == "set-cookie" and v.startswith("lp_console="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/admin/ui" in cookie
    assert TOKEN not in cookie
    assert "adapter-0001" in client.get(f"{CONSOLE}/adapters?owner=team-1").text


def test_bad_sign_ins_are_refused(client: TestClient) -> None:
    pre = _csrf(client.get(f"{CONSOLE}/signin").text)
    r = client.post(f"{CONSOLE}/signin", data={"csrf": pre, "token": "wrong"}, follow_redirects=False)
    assert r.status_code == 401 and "Unknown or revoked token" in r.text
    assert "lp_console=" not in r.headers.get("set-cookie", "")
    r = client.post(f"{CONSOLE}/signin", data={"csrf": "forged", "token": TOKEN}, follow_redirects=False)
    assert r.status_code == 403  # the sign-in form's own double-submit token
    # a tenant key is not an admin token
    assert (
        client.post(f"{CONSOLE}/signin", data={"csrf": _csrf(r.text), "token": "lp-abc"}).status_code == 401
    )


def test_next_never_leaves_the_console(client: TestClient) -> None:
    for evil in ("https://evil.example/", "//evil.example/admin/ui/x", "/admin/v1/adapters"):
        pre = _csrf(client.get(f"{CONSOLE}/signin").text)
        r = client.post(
            f"{CONSOLE}/signin", data={"csrf": pre, "token": TOKEN, "next": evil}, follow_redirects=False
        )
        assert r.headers["location"] == f"{CONSOLE}/adapters", evil


def test_a_refreshing_table_whose_session_ended_sends_the_page_to_sign_in(client: TestClient) -> None:
    r = client.get(f"{CONSOLE}/adapters", headers={"HX-Request": "true"}, follow_redirects=False)
    assert r.status_code == 200 and r.text == ""
    assert r.headers["hx-redirect"] == f"{CONSOLE}/signin?next=%2Fadmin%2Fui%2Fadapters"


def test_tampered_or_foreign_cookie_means_signed_out(client: TestClient) -> None:
    _sign_in(client)
    value = client.cookies["lp_console"]
    client.cookies.clear()
    data, sig = value.split(".")
    other, _ = SessionCodec(b"another-secret").issue("bootstrap", "admin", ())
    for cookie in (value, data[:-2] + "xx." + sig, other, "garbage", "a.b.c"):
        r = client.get(
            f"{CONSOLE}/adapters", headers={"Cookie": f"lp_console={cookie}"}, follow_redirects=False
        )
        assert r.status_code == (200 if cookie == value else 303), cookie


def test_every_page_has_the_security_headers_and_no_inline_code(client: TestClient) -> None:
    _sign_in(client)
    for page in (*PAGES, "/signin", "/adapters/nope"):
        r = client.get(CONSOLE + page)
        assert r.status_code in (200, 404), (page, r.status_code)
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "frame-ancestors 'none'" in csp and r.headers["x-frame-options"] == "DENY"
        assert r.headers["cache-control"] == "no-store"
        html = r.text
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), page  # every script is a file
        assert not re.search(r"\sstyle=|<style", html), page
        assert not re.search(r"\son[a-z]+=", html), page  # no inline event handlers


def test_preview_commits_nothing_and_the_change_is_applied_once_confirmed(
    app: FastAPI, client: TestClient
) -> None:
    st: AdminState = app.state.admin
    _sign_in(client)

    def events() -> int:
        with session_scope(st.factory) as s:
            return len(audit_svc.list_events(s, limit=500, subject_id="adapter-0003").data)

    before = events()
    r = client.get(f"{CONSOLE}/adapters/adapter-0003/confirm?action=canary&version=v2&weight=25")
    assert r.status_code == 200
    assert "Canary: none → v2 at 25 %." in r.text
    assert "Traffic served: v1 100 % → v1 75 % and canary v2 25 %." in r.text
    assert events() == before
    page = client.get(f"{CONSOLE}/adapters/adapter-0003").text
    assert 'id="canary-version">none' in page
    r = client.post(
        f"{CONSOLE}/adapters/adapter-0003/act",
        data={"csrf": _csrf(page), "action": "canary", "version": "v2", "weight": "25"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert 'id="canary-version">v2 at 25 %' in client.get(f"{CONSOLE}/adapters/adapter-0003").text
    assert events() == before + 1


def test_bad_input_gets_a_clear_page_never_a_500(client: TestClient) -> None:
    _sign_in(client)
    cases = {
        "/adapters/adapter-0003/confirm?action=explode": (422, "unknown action"),
        "/adapters/adapter-0003/confirm?action=canary&version=v2&weight=0": (422, "between 1 and 99"),
        "/adapters/adapter-0003/confirm?action=canary&version=v2&weight=abc": (422, "whole percentage"),
        "/adapters/adapter-0003/confirm?action=promote": (422, "needs a version"),
        "/adapters/adapter-0003/confirm?action=promote&version=banana": (422, "v1, v2"),
        "/adapters/adapter-0003/confirm?action=promote&version=v9": (404, "version_not_found"),
        "/adapters/NOPE": (422, "slug"),
        "/adapters/missing-one": (404, "adapter_not_found"),
        "/adapters?status=weird": (422, "status must be one of"),
        "/audit?since=yesterday": (422, "ISO 8601"),
        "/tenants/nobody": (404, "tenant_not_found"),
        "/adapters?cursor=%%%": (422, "cursor"),
    }
    for page, (status, text) in cases.items():
        r = client.get(CONSOLE + page)
        assert r.status_code == status and text in r.text, (page, r.status_code, r.text[-600:])


def test_tenant_pages_show_every_tenant_limit_including_max_cold_waiters(
    app: FastAPI, client: TestClient
) -> None:
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        tenant_svc.update_tenant(s, "tenant-02", {"limits": {"max_cold_waiters": 7}}, actor="test")
    _sign_in(client)
    listing = client.get(f"{CONSOLE}/tenants").text
    assert '<th scope="col">Max cold waiters</th>' in listing
    row = re.search(r'<tr><th scope="row"><a href="[^"]*/tenants/tenant-02">.*?</tr>', listing, re.S)
    assert row is not None
    assert re.findall(r"<td>([^<]*)</td>", row.group(0)) == [
        "tenant-02",
        "600",
        "unlimited",
        "unlimited",
        "7",
        "no",
    ]
    page = client.get(f"{CONSOLE}/tenants/tenant-02").text
    assert '<dd id="max-cold-waiters">7</dd>' in page
    other = client.get(f"{CONSOLE}/tenants/tenant-03").text
    assert '<dd id="max-cold-waiters">unlimited</dd>' in other


def test_adapter_page_shows_its_serving_policy_limits_and_approvals(app: FastAPI, client: TestClient) -> None:
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        adapter_svc.update_adapter(
            s,
            "adapter-0007",
            {"on_load_failure": "previous_version", "limits": {"rpm": 300}, "approvals_required": 2},
            actor="test",
        )
    _sign_in(client)
    page = client.get(f"{CONSOLE}/adapters/adapter-0007").text
    assert '<dd id="on-load-failure">previous_version</dd>' in page
    assert '<dd id="adapter-limits">rpm 300 · tpm unlimited · concurrency unlimited</dd>' in page
    assert '<dd id="approvals-required">2</dd>' in page and '<dd id="canary-analysis">off</dd>' in page
    other = client.get(f"{CONSOLE}/adapters/adapter-0008").text
    assert '<dd id="on-load-failure">error</dd>' in other
    assert '<dd id="approvals-required">as its base model</dd>' in other


def _actions_the_product_writes() -> set[str]:
    """Audit action names in the source: ``action="x.y"`` (and ``action="x.y" if c else "x.z"``),
    ``.event("x.y"`` and promotions' ``_event(session, actor, "x.y"``."""
    name = r'"([a-z_]+\.[a-z_]+)"'
    pattern = re.compile(
        rf'(?:action=|\.event\(|_event\([^"]{{0,60}})\s*{name}(?: if \w+ else {name})?', re.S
    )
    root = Path(__file__).resolve().parents[2]
    found: set[str] = set()
    for package in ("registry", "router", "gateway"):
        for path in (root / package).rglob("*.py"):
            for first, other in pattern.findall(path.read_text()):
                found |= {first, other} - {""}
    return found


def test_audit_filters_offer_every_action_and_subject_type_the_product_writes(
    app: FastAPI, client: TestClient
) -> None:
    written = _actions_the_product_writes()
    assert {"promotion.requested", "adapter.fallback", "version.canary_aborted", "key.issued"} <= written
    _sign_in(client)
    page = client.get(f"{CONSOLE}/audit").text
    select = re.search(r'<select name="action">(.*?)</select>', page, re.S)
    assert select is not None
    offered = set(re.findall(r'<option value="([^"]+)"', select.group(1)))
    assert written <= offered, sorted(written - offered)
    types = re.search(r'<select name="subject_type">(.*?)</select>', page, re.S)
    assert types is not None
    assert set(re.findall(r'<option value="([^"]+)"', types.group(1))) == {
        "adapter",
        "tenant",
        "base_model",
        "owner",
        "principal",
    }
    # a filter on one of them keeps it selected and finds its events
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        audit_svc.record_change(
            s,
            actor="test",
            action="owner.limits_updated",
            subject_type="owner",
            subject_id="team-9",
            details={},
        )
    r = client.get(f"{CONSOLE}/audit", params={"action": "owner.limits_updated", "subject_type": "owner"})
    assert '<option value="owner.limits_updated" selected>' in r.text
    assert '<option value="owner" selected>' in r.text and "owner team-9" in r.text


def test_posts_need_the_session_csrf_token(client: TestClient) -> None:
    _sign_in(client)
    for data in ({"action": "disable"}, {"action": "disable", "csrf": "x" * 32}):
        r = client.post(f"{CONSOLE}/adapters/adapter-0004/act", data=data)
        assert r.status_code == 403 and "csrf_failed" in r.text
    assert 'class="badge active">active' in client.get(f"{CONSOLE}/adapters/adapter-0004").text
    r = client.post(f"{CONSOLE}/signout", data={})
    assert r.status_code == 403
    page = client.get(f"{CONSOLE}/adapters").text
    r = client.post(f"{CONSOLE}/signout", data={"csrf": _csrf(page)}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get(f"{CONSOLE}/adapters", follow_redirects=False).status_code == 303


@pytest.mark.slow
def test_pages_stay_fast_with_1000_adapters_and_50_replicas(tmp_path: Path) -> None:
    """Target 200 ms (see ``benchmarks/console.py``); the bound here is generous for a busy CI."""
    app = _app(tmp_path, adapters=1000, replicas=50)
    with TestClient(app) as client:
        _sign_in(client)
        for page in PAGES:
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                r = client.get(CONSOLE + page)
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200, page
            assert statistics.median(times) < 1.0, (page, times)
        grid = client.get(f"{CONSOLE}/replicas").text
        assert grid.count('<th scope="col" title="http://10.0.') == 50  # every replica is a column


def test_promote_with_approvals_records_a_request_and_another_principal_approves_it(
    app: FastAPI, client: TestClient
) -> None:
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        adapter_svc.update_adapter(s, "adapter-0007", {"approvals_required": 1}, actor="test")
        principal_svc.create_principal(
            s, principal_id="approver-7", role="approver", owners=["team-7"], actor="t"
        )
        approver_token = principal_svc.issue_token(s, "approver-7", actor="test").token
    _sign_in(client)
    r = client.get(f"{CONSOLE}/adapters/adapter-0007/confirm?action=promote&version=v2")
    assert "Nothing served changes yet: a promotion request for v2 is recorded" in r.text
    page = client.get(f"{CONSOLE}/adapters/adapter-0007").text
    r = client.post(
        f"{CONSOLE}/adapters/adapter-0007/act",
        data={"csrf": _csrf(page), "action": "promote", "version": "v2"},
    )
    assert "requested (pr-" in r.text and "waiting for 1 approval(s)" in r.text
    assert 'id="active-version">v1' in r.text
    assert 'id="pending-promotions"' in r.text and "promote v2, 0/1 approvals" in r.text
    inbox = client.get(f"{CONSOLE}/approvals?adapter_id=adapter-0007").text
    assert "you requested this promotion: another approver must approve it" in inbox
    promotion = re.search(r'data-promotion="(pr-[^"]+)"', inbox)
    assert promotion is not None
    with TestClient(app) as other:
        _sign_in(other, approver_token)
        inbox = other.get(f"{CONSOLE}/approvals?adapter_id=adapter-0007").text
        assert f"Approve {promotion.group(1)}</button>" in inbox
        r = other.post(
            f"{CONSOLE}/approvals/{promotion.group(1)}/approve", data={"csrf": _csrf(inbox), "comment": "ok"}
        )
        assert r.status_code == 200 and f"{promotion.group(1)}: executed" in r.text
        # an approver may not promote by itself: the button is disabled with the reason
        page = other.get(f"{CONSOLE}/adapters/adapter-0007").text
        assert 'id="active-version">v2' in page
        assert "needs adapter.promote" in page


def test_revoking_the_token_signs_the_session_out_and_role_changes_apply_at_once(
    app: FastAPI, client: TestClient
) -> None:
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        principal_svc.create_principal(s, principal_id="ops-9", role="viewer", owners=[], actor="test")
        issued = principal_svc.issue_token(s, "ops-9", actor="test")
    _sign_in(client, issued.token)
    assert "needs adapter.rollback" in client.get(f"{CONSOLE}/adapters/adapter-0009").text
    with session_scope(st.factory) as s:
        principal_svc.update_principal(s, "ops-9", {"role": "operator"}, actor="test")
    page = client.get(f"{CONSOLE}/adapters/adapter-0009").text
    assert "needs adapter.rollback" not in page and "(operator)" in page
    with session_scope(st.factory) as s:
        principal_svc.revoke_token(s, "ops-9", issued.token_id, actor="test")
    r = client.get(f"{CONSOLE}/adapters/adapter-0009", follow_redirects=False)
    assert r.status_code == 303 and "/admin/ui/signin" in r.headers["location"]
