"""The console's operator pages over HTTP (issue 25.4, 25.10; in-process, real SQLite registry):
a tenant page that revokes keys, grants and revokes adapters and changes limits (each through the
same service call as the API, audited, never a 500 for bad input); the audit log newest first;
the principals list with the bootstrap principal; the traffic page's errors apart from 429s and
latency for non-streamed traffic. The same in Chromium: test_console_browser."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kit.db import session_scope
from registry.api.deps import AdminState
from registry.console import set_traffic
from registry.console.traffic import Counters, Sample
from registry.console.traffic_ring import RingTraffic
from registry.services import audit as audit_svc
from registry.services import principals as principal_svc
from registry.services import tenants as tenant_svc
from tests.console.test_console_http import CONSOLE, _app, _csrf, _sign_in


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return _app(tmp_path_factory.mktemp("console-operator"))


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield _sign_in(c)


def _tenant(app: FastAPI, tenant_id: str) -> tenant_svc.TenantRecord:
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        return tenant_svc.describe_tenant(s, tenant_id)


def _keys(app: FastAPI, tenant_id: str) -> list[tenant_svc.KeyRecord]:
    return list(_tenant(app, tenant_id).keys or [])


def _act(client: TestClient, tenant_id: str, **data: str) -> tuple[int, str, str]:
    page = client.get(f"{CONSOLE}/tenants/{tenant_id}").text
    r = client.post(
        f"{CONSOLE}/tenants/{tenant_id}/act", data={"csrf": _csrf(page), **data}, follow_redirects=False
    )
    return r.status_code, r.headers.get("location", ""), r.text


def test_revoke_a_key_after_a_confirmation(app: FastAPI, client: TestClient) -> None:
    [key] = _tenant(app, "tenant-04").keys or []
    page = client.get(f"{CONSOLE}/tenants/tenant-04").text
    link = re.search(r'href="([^"]*/tenants/tenant-04/confirm\?action=revoke_key[^"]*)"', page)
    assert link is not None and key.key_id in link.group(1)
    confirm = client.get(link.group(1).replace("&amp;", "&"))
    assert confirm.status_code == 200 and "get 401 at once" in confirm.text
    assert _keys(app, "tenant-04")[0].revoked_at is None  # the confirmation changes nothing
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', confirm.text))
    r = client.post(f"{CONSOLE}/tenants/tenant-04/act", data=form, follow_redirects=False)
    assert r.status_code == 303 and "done=key" in r.headers["location"]
    assert _keys(app, "tenant-04")[0].revoked_at is not None
    assert "revoked" in client.get(r.headers["location"]).text
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        [ev] = audit_svc.list_events(s, action="key.revoked", subject_id="tenant-04").data
    assert ev.actor == "bootstrap" and ev.details["key_id"] == key.key_id
    again = client.get(link.group(1).replace("&amp;", "&"))
    assert again.status_code == 422 and "no live key" in again.text  # already revoked


def test_grant_and_revoke_an_adapter(app: FastAPI, client: TestClient) -> None:
    assert "adapter-0003" not in {g.adapter_id for g in _tenant(app, "tenant-05").grants or []}
    page = client.get(f"{CONSOLE}/tenants/tenant-05").text
    assert '<option value="adapter-0003">' in page  # offered in the grant form
    status, where, _ = _act(client, "tenant-05", action="grant", adapter_id="adapter-0003", rpm="60", tpm="")
    assert status == 303 and "granted" in where
    grants = {g.adapter_id: g for g in _tenant(app, "tenant-05").grants or []}
    assert (grants["adapter-0003"].rpm, grants["adapter-0003"].tpm) == (60, None)
    confirm = client.get(
        f"{CONSOLE}/tenants/tenant-05/confirm",
        params={"action": "revoke_grant", "adapter_id": "adapter-0003"},
    )
    assert "404 model_not_found at once" in confirm.text
    status, _, _ = _act(client, "tenant-05", action="revoke_grant", adapter_id="adapter-0003")
    assert status == 303
    assert "adapter-0003" not in {g.adapter_id for g in _tenant(app, "tenant-05").grants or []}
    status, _, text = _act(client, "tenant-05", action="grant", adapter_id="no-such-adapter")
    assert status == 404 and "adapter_not_found" in text


def test_change_limits_and_bad_values_are_422(app: FastAPI, client: TestClient) -> None:
    status, _, _ = _act(
        client, "tenant-06", action="limits", rpm="120", tpm="", max_concurrency="4", max_cold_waiters="",
        base_model_access="on",
    )  # fmt: skip
    assert status == 303
    t = _tenant(app, "tenant-06")
    assert (t.limits.rpm, t.limits.tpm, t.limits.max_concurrency) == (120, None, 4)
    assert t.base_model_access is True
    page = client.get(f"{CONSOLE}/tenants/tenant-06").text
    assert 'name="rpm" value="120"' in page and 'name="base_model_access" checked' in page
    for bad in ("-1", "ten", "1e3", "99999999999", "\x00"):
        status, _, text = _act(client, "tenant-06", action="limits", rpm=bad)
        assert status == 422 and "rpm" in text, (bad, status)
    for data in ({"action": "nope"}, {"action": "revoke_key"}, {"action": "grant", "adapter_id": ""}):
        status, _, _ = _act(client, "tenant-06", **data)
        assert status == 422, data
    assert _tenant(app, "tenant-06").limits.rpm == 120  # nothing half-written
    r = client.get(f"{CONSOLE}/tenants/tenant-06/confirm", params={"action": "explode"})
    assert r.status_code == 422


def test_a_viewer_sees_disabled_actions_and_cannot_post(app: FastAPI) -> None:
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        principal_svc.create_principal(s, principal_id="vera", role="viewer", owners=None, actor="test")
        token = principal_svc.issue_token(s, "vera", actor="test").token
    with TestClient(app) as c:
        _sign_in(c, token)
        page = c.get(f"{CONSOLE}/tenants/tenant-07").text
        assert "limits-form" not in page and "grant-form" not in page and "Revoke…" not in page
        assert "needs tenant.write" in page
        r = c.post(
            f"{CONSOLE}/tenants/tenant-07/act", data={"csrf": _csrf(page), "action": "limits", "rpm": "1"}
        )
        assert r.status_code == 403
    assert _tenant(app, "tenant-07").limits.rpm == 600


def test_audit_is_newest_first_with_an_option_for_oldest_first(app: FastAPI, client: TestClient) -> None:
    st: AdminState = app.state.admin
    for n in range(3):
        with session_scope(st.factory) as s:
            audit_svc.record_change(
                s, actor="test", action="tenant.updated", subject_type="tenant", subject_id="tenant-09",
                details={"n": n},
            )  # fmt: skip
    params = {"action": "tenant.updated", "subject_id": "tenant-09"}
    page = client.get(f"{CONSOLE}/audit", params=params).text
    assert re.findall(r"{\"n\": (\d)}", page) == ["2", "1", "0"]
    assert "Newest first" in page
    page = client.get(f"{CONSOLE}/audit", params={**params, "order": "asc"}).text
    assert re.findall(r"{\"n\": (\d)}", page) == ["0", "1", "2"]
    assert '<option value="asc" selected>' in page
    since = re.search(r'name="since" class="since" value="([^"]*)" size="(\d+)"', page)
    assert since is not None and len(since.group(1)) <= int(since.group(2))  # the field fits its value


def test_principals_list_starts_with_bootstrap(app: FastAPI, client: TestClient) -> None:
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        principal_svc.create_principal(s, principal_id="mia", role="maintainer", owners=["team-1"], actor="t")
    page = client.get(f"{CONSOLE}/principals").text
    rows = re.findall(r'<th scope="row">([a-z-]+)', page)
    assert rows[0] == "bootstrap" and "mia" in rows
    assert "bootstrap <small>(you)</small>" in page and "LORAPLANE_ADMIN_TOKEN" in page
    assert 'href="/admin/ui/principals"' in page  # in the navigation


def test_traffic_counts_429s_apart_and_shows_latency_of_non_streamed_answers(
    tmp_path: Path,
) -> None:
    app = _app(tmp_path, adapters=2, replicas=1)
    lat = {0.025: 0.0, 0.05: 10.0, math.inf: 10.0}
    ring = RingTraffic([], capacity=10)
    ring.add(Sample(0.0, {("adapter-0001", "v1"): Counters()}))
    ring.add(
        Sample(10.0, {("adapter-0001", "v1"): Counters(requests=12, errors=1, rate_limited=2, latency=lat)})
    )
    set_traffic(app, ring)
    with TestClient(app) as c:
        page = _sign_in(c).get(f"{CONSOLE}/traffic").text
    row = re.search(r'<tr data-series="adapter-0001/v1">(.*?)</tr>', page, re.S)
    assert row is not None
    assert '<td class="errors">1</td><td class="limited">2</td>' in row.group(1)
    latency = re.search(r'<td class="latency">([^<]*)</td>', row.group(1))
    assert latency is not None and latency.group(1).startswith("38 ms /")  # p50 inside 25–50 ms
    assert "– / –" in row.group(1)  # no TTFT: nothing was streamed
