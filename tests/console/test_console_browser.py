"""The admin console in a real headless Chromium against a real ``loraplane up --demo`` process.

An operator signs in with the admin token, finds an adapter, starts a 10 % canary with the
slider (the adapters list, open in another tab, shows the new canary without a reload), promotes,
rolls back and finds the rollback in the audit log; replicas, traffic and tenants pages show what
the platform really did (a key is issued and shown once). A forged form post without the CSRF
token is refused, and a viewer principal sees the buttons it may not use disabled with the
reason. On a tenant's page an operator changes limits, grants and revokes an adapter and revokes
a key (the gateway refuses it at once); the traffic page counts designed 429s apart from errors
and shows the latency of non-streamed answers; the audit log reads newest first with a Since
field that shows its whole value; the principals page lists ``bootstrap``, the principal
``loraplane whoami`` reports. No page logs a Content-Security-Policy violation. Screenshots of
every page go to the test's temp dir; the adapter page's is also written to
``docs/console-adapter.png``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from kit.db import make_engine, make_session_factory, session_scope
from registry.adapter_factory import write_adapter
from registry.admin_client import AdminClient
from registry.services import principals as principal_svc
from registry.settings import RegistrySettings
from tests.console.console_platform import ADMIN_TOKEN, Up, chromium_path

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("console-browser")]

DOCS_PNG = Path(__file__).resolve().parents[2] / "docs" / "console-adapter.png"
ADAPTER = "demo-support"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def prepared(up: Up) -> Up:
    """A second version of the demo adapter (for the canary) and some real gateway traffic."""
    with AdminClient(up.admin_url, ADMIN_TOKEN) as admin:
        if len(admin.get_adapter(ADAPTER)["versions"]) < 2:
            d = write_adapter(up.data_dir.parent / "v2", seed=77, rank=8, target_modules=("q_proj", "v_proj"))
            admin.upload_version(ADAPTER, d)
    body = {"model": f"demo-base:{ADAPTER}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with httpx.Client(base_url=up.gateway_url, headers={"Authorization": f"Bearer {up.demo_key}"}) as gw:
        for i in range(6):  # half of them streamed: TTFT and ITL are measured on streams
            r = gw.post("/v1/chat/completions", json={**body, "stream": i % 2 == 0}, timeout=60)
            assert r.status_code == 200, r.text
    return up


class Tab:
    """A page that records console errors (CSP violations are reported there) and screenshots."""

    def __init__(self, page: Page, shots: Path) -> None:
        self.page = page
        self.shots = shots
        self.errors: list[str] = []
        page.on("console", self._console)

    def _console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            self.errors.append(msg.text)

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def sign_in(tab: Tab, up: Up, token: str) -> None:
    page = tab.page
    page.goto(f"{up.console}/adapters")
    expect(page).to_have_url(re.compile(r"/admin/ui/signin\?next="))
    tab.shot("signin")
    page.get_by_label("Admin token").fill(token)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Adapters")).to_be_visible()


def canary_cell(page: Page, adapter: str) -> str:
    return page.locator(f'tr[data-adapter="{adapter}"] td.canary-col').inner_text()


def test_operator_canary_promote_rollback_and_audit(browser: Browser, prepared: Up, tmp_path: Path) -> None:
    up = prepared
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    tab = Tab(ctx.new_page(), tmp_path)
    page = tab.page
    sign_in(tab, up, ADMIN_TOKEN)
    cookies = {c["name"]: c for c in ctx.cookies()}
    session = cookies["lp_console"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert ADMIN_TOKEN not in session["value"]
    assert page.evaluate("document.cookie") == ""  # nothing readable by scripts

    # find the adapter: filter by owner, then follow its link
    page.get_by_label("Owner").fill("demo")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator('tr[data-adapter="demo-sql"]')).to_be_visible()
    assert canary_cell(page, ADAPTER) == "–"
    tab.shot("adapters")

    # a second tab keeps the adapters list open: its table refreshes itself
    watcher = Tab(ctx.new_page(), tmp_path)
    watcher.page.goto(f"{up.console}/adapters")
    expect(watcher.page.locator(f'tr[data-adapter="{ADAPTER}"] td.canary-col')).to_have_text("–")

    page.get_by_role("link", name=ADAPTER, exact=True).click()
    expect(page.get_by_role("heading", name=re.compile(ADAPTER))).to_be_visible()
    expect(page.locator("#active-version")).to_have_text("v1")
    slider = page.get_by_label("Canary weight for v2")
    slider.fill("35")
    expect(page.locator("#wo-v2")).to_have_text("35 %")  # console.js mirrors the slider
    slider.fill("10")
    expect(page.locator("#wo-v2")).to_have_text("10 %")
    page.get_by_role("button", name="Canary v2").click()

    # the confirmation says exactly what will change
    lines = page.locator("#change-lines li")
    expect(lines.filter(has_text="Canary: none → v2 at 10 %.")).to_have_count(1)
    expect(lines.filter(has_text="Version v2: ready → canary.")).to_have_count(1)
    expect(lines.filter(has_text="Traffic served: v1 100 % → v1 90 % and canary v2 10 %.")).to_have_count(1)
    tab.shot("confirm-canary")
    page.get_by_role("button", name="Confirm: start canary v2").click()
    expect(page.locator("#canary-version")).to_have_text("v2 at 10 %")
    expect(page.locator("#done")).to_have_text("Start canary v2 at 10 %: done")
    page.screenshot(path=str(tmp_path / "adapter.png"))
    DOCS_PNG.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(DOCS_PNG))  # the README's picture: the viewport, not the full page

    # the other tab's canary column changed without a reload
    expect(watcher.page.locator(f'tr[data-adapter="{ADAPTER}"] td.canary-col')).to_have_text(
        "v2 · 10 %", timeout=15_000
    )
    with AdminClient(up.admin_url, ADMIN_TOKEN) as admin:
        rec = admin.get_adapter(ADAPTER)
    assert (rec["canary_version"], rec["canary_weight"]) == ("v2", 10)

    # promote v2, then roll back with one button
    page.get_by_role("button", name="Promote v2").click()
    expect(page.locator("#change-lines li").filter(has_text="Active version: v1 → v2.")).to_have_count(1)
    page.get_by_role("button", name="Confirm: promote v2").click()
    expect(page.locator("#active-version")).to_have_text("v2")
    page.get_by_role("button", name="Roll back").click()
    expect(page.locator("#change-lines li").filter(has_text="Active version: v2 → v1.")).to_have_count(1)
    tab.shot("confirm-rollback")
    page.get_by_role("button", name="Confirm: roll back").click()
    expect(page.locator("#active-version")).to_have_text("v1")
    expect(page.locator("#adapter-audit tbody tr").first).to_contain_text("adapter.rolled_back")

    # rolling back again would be refused: the confirmation shows why, with no confirm button
    page.get_by_role("button", name="Roll back").click()
    expect(page.get_by_role("alert")).to_contain_text("no_rollback_target")
    expect(page.get_by_role("button", name=re.compile("^Confirm"))).to_have_count(0)

    # the audit log has the rollback, by the signed-in principal
    page.get_by_role("navigation").get_by_role("link", name="Audit").click()
    page.get_by_label("Action").select_option("adapter.rolled_back")
    page.get_by_role("button", name="Filter").click()
    row = page.locator("#audit tbody tr").filter(has_text=ADAPTER)
    expect(row).to_have_count(1)
    expect(row).to_contain_text("bootstrap")
    tab.shot("audit")

    # replicas: both simulated replicas, the demo adapter resident where the traffic went
    page.get_by_role("navigation").get_by_role("link", name="Replicas").click()
    expect(page.locator("#replicas tbody tr")).to_have_count(2)
    resident = page.locator("#matrix tbody tr").filter(has_text=ADAPTER).locator("td.resident")
    expect(resident).not_to_have_count(0)
    tab.shot("replicas")

    # traffic: the requests sent before the test, sampled from the gateway's own metrics
    deadline = time.monotonic() + 30
    while True:
        page.goto(f"{up.console}/traffic")
        row = page.locator(f'#traffic tr[data-series="{ADAPTER}/v1"]')
        if row.count() or time.monotonic() > deadline:
            break
        time.sleep(1)
    expect(row).to_have_count(1)
    cells = row.locator("td").all_inner_texts()
    assert int(cells[1]) >= 6, cells  # requests
    assert cells[2] == "0" and cells[3] == "0", cells  # errors, 429s
    assert "ms" in cells[4] and "ms" in cells[5], cells  # latency (every answer), TTFT (streams)
    assert row.locator("svg polyline").count() == 2
    tab.shot("traffic")

    # tenants: issue a key and see it once
    page.get_by_role("navigation").get_by_role("link", name="Approvals").click()
    expect(page.get_by_role("heading", name="Approvals")).to_be_visible()
    tab.shot("approvals")
    page.get_by_role("navigation").get_by_role("link", name="Tenants").click()
    tab.shot("tenants")
    page.get_by_role("link", name="demo", exact=True).click()
    before = page.locator("#keys tbody tr").count()
    page.get_by_role("button", name="Issue a key").click()
    key = page.get_by_label("Key").input_value()
    assert key.startswith("lp-")
    tab.shot("key-issued")
    page.get_by_role("link", name="Back to demo").click()
    expect(page.locator("#keys tbody tr")).to_have_count(before + 1)
    assert key not in page.content()
    tab.shot("tenant")
    with httpx.Client(base_url=up.gateway_url) as gw:
        assert gw.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200

    # keyboard: the skip link comes first, then the navigation is reachable with Tab
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Adapters"
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Adapters")).to_be_visible()

    # no CSP violation, no script error, no missing resource (the refused rollback's page is a 409)
    errors = [e for e in tab.errors + watcher.errors if "status of 409" not in e]
    assert not errors, errors
    ctx.close()


def test_forged_post_without_csrf_token_is_refused(browser: Browser, prepared: Up, tmp_path: Path) -> None:
    up = prepared
    ctx = browser.new_context()
    tab = Tab(ctx.new_page(), tmp_path)
    sign_in(tab, up, ADMIN_TOKEN)
    with AdminClient(up.admin_url, ADMIN_TOKEN) as admin:
        before = admin.get_adapter(ADAPTER)
    url = f"{up.console}/adapters/{ADAPTER}/act"
    # the browser's own cookies go along (same origin), but the form has no / a wrong CSRF token
    forms: list[dict[str, str | float | bool]] = [
        {"action": "disable"},
        {"action": "disable", "csrf": "forged"},
    ]
    for form in forms:
        r = tab.page.request.post(url, form=form, max_redirects=0)
        assert r.status == 403, r.text()
        assert "csrf_failed" in r.text()
    r = tab.page.request.post(f"{up.console}/tenants/demo/keys", form={}, max_redirects=0)
    assert r.status == 403
    with AdminClient(up.admin_url, ADMIN_TOKEN) as admin:
        after = admin.get_adapter(ADAPTER)
    assert after["status"] == before["status"] == "active"
    # and without a session at all, a post is sent to sign in, never applied
    bare = httpx.post(url, data={"action": "disable"}, follow_redirects=False)
    assert bare.status_code == 303 and "/admin/ui/signin" in bare.headers["location"]
    ctx.close()


def test_viewer_sees_disabled_buttons_with_the_reason(browser: Browser, prepared: Up, tmp_path: Path) -> None:
    up = prepared
    url = RegistrySettings(data_dir=up.data_dir).resolved_database_url()
    engine = make_engine(url)
    try:
        with session_scope(make_session_factory(engine)) as s:
            principal_svc.create_principal(
                s, principal_id="ops-viewer", role="maintainer", owners=["team-x"], actor="test"
            )
            token = principal_svc.issue_token(s, "ops-viewer", actor="test").token
    finally:
        engine.dispose()
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    tab = Tab(ctx.new_page(), tmp_path)
    sign_in(tab, up, token)
    page = tab.page
    expect(page.locator("header")).to_contain_text("ops-viewer")
    page.goto(f"{up.console}/adapters/{ADAPTER}")
    rollback = page.get_by_role("button", name="Roll back")
    expect(rollback).to_be_disabled()
    reason = page.locator("#why-rollback")
    expect(reason).to_contain_text("needs adapter.rollback on owner 'demo'")
    expect(page.get_by_role("button", name="Canary v2")).to_be_disabled()
    tab.shot("adapter-maintainer-out-of-scope")
    # the server refuses too, even with a valid CSRF token
    csrf = page.locator('header form input[name="csrf"]').input_value()
    r = page.request.post(
        f"{up.console}/adapters/{ADAPTER}/act", form={"action": "rollback", "csrf": csrf}, max_redirects=0
    )
    assert r.status == 403 and "adapter.rollback" in r.text()
    r = page.request.get(f"{up.console}/adapters/{ADAPTER}/confirm?action=disable", max_redirects=0)
    assert r.status == 403
    assert not tab.errors, tab.errors
    ctx.close()


def test_operator_tenant_page_traffic_429s_audit_and_principals(
    browser: Browser, prepared: Up, tmp_path: Path
) -> None:
    up = prepared
    with AdminClient(up.admin_url, ADMIN_TOKEN) as admin:
        try:
            admin.get_tenant("acme")
        except Exception:
            admin.create_tenant("acme", name="Acme", limits={"rpm": 100})
        key = admin.issue_key("acme")["key"]
        admin.put_grant("demo", "demo-sql", rpm=2)  # the third request in a minute is a designed 429
    body = {"model": "demo-base:demo-sql", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(base_url=up.gateway_url, headers={"Authorization": f"Bearer {up.demo_key}"}) as gw:
        codes = [gw.post("/v1/chat/completions", json=body, timeout=60).status_code for _ in range(4)]
    assert sorted(codes) == [200, 200, 429, 429], codes

    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    tab = Tab(ctx.new_page(), tmp_path)
    page = tab.page
    sign_in(tab, up, ADMIN_TOKEN)

    # traffic: two designed 429s are not errors; non-streamed answers have a latency
    deadline = time.monotonic() + 30
    while True:
        page.goto(f"{up.console}/traffic")
        row = page.locator('#traffic tr[data-series="demo-sql/v1"]')
        cells = row.locator("td").all_inner_texts() if row.count() else []
        if (cells and cells[3] == "2") or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert cells[1:4] == ["4", "0", "2"], cells  # requests, errors, 429s
    assert re.match(r"^[\d.]+ ms / [\d.]+ ms$", cells[4]), cells  # latency of the two answers
    assert cells[5] == "– / –", cells  # nothing was streamed: no TTFT
    tab.shot("traffic-429")

    # the tenant page: limits, grant, revoke grant, revoke key
    page.goto(f"{up.console}/tenants/acme")
    page.get_by_label("Requests per minute").fill("250")
    page.get_by_label("Base model access").check()
    page.get_by_role("button", name="Save limits").click()
    expect(page.locator("#done")).to_have_text("acme: limits saved.")
    expect(page.get_by_label("Requests per minute")).to_have_value("250")
    page.get_by_label("Adapter", exact=True).fill("demo-sql")
    page.get_by_role("button", name="Grant").click()
    expect(page.locator("#grants tbody tr").filter(has_text="demo-sql")).to_have_count(1)
    with httpx.Client(base_url=up.gateway_url, headers={"Authorization": f"Bearer {key}"}) as gw:
        assert gw.post("/v1/chat/completions", json=body, timeout=60).status_code == 200
        tab.shot("tenant-granted")
        page.locator("#grants tbody tr").filter(has_text="demo-sql").get_by_role(
            "link", name="Revoke…"
        ).click()
        expect(page.locator("#change-lines")).to_contain_text("404 model_not_found at once")
        page.get_by_role("button", name="Confirm: Revoke the grant of demo-sql").click()
        expect(page.locator("#done")).to_have_text("acme: grant of demo-sql revoked.")
        expect(page.locator("#grants tbody tr").filter(has_text="demo-sql")).to_have_count(0)
        time.sleep(1.5)  # every gateway within a second (SPEC §4)
        assert gw.post("/v1/chat/completions", json=body, timeout=60).status_code == 404
        page.locator("#keys tbody tr").filter(has_text=key[:8]).get_by_role("link", name="Revoke…").click()
        expect(page.locator("#change-lines")).to_contain_text("get 401 at once")
        tab.shot("tenant-confirm-revoke-key")
        page.get_by_role("button", name=re.compile("^Confirm: Revoke key")).click()
        expect(page.locator("#done")).to_contain_text("revoked")
        time.sleep(1.5)
        assert gw.get("/v1/models").status_code == 401
    tab.shot("tenant-after")

    # the audit log: newest first (the key revocation on top), the Since value shown whole
    page.get_by_role("navigation").get_by_role("link", name="Audit").click()
    expect(page.locator("#audit tbody tr").first).to_contain_text("key.revoked")
    since = page.get_by_label("Since (UTC)")
    assert since.evaluate("el => el.scrollWidth <= el.clientWidth"), since.input_value()
    page.get_by_label("Order").select_option("asc")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#audit tbody tr").first).not_to_contain_text("key.revoked")
    tab.shot("audit-oldest-first")

    # principals: bootstrap (what `loraplane whoami` reports) is listed
    page.get_by_role("navigation").get_by_role("link", name="Principals").click()
    expect(page.locator("#principals tbody tr").first).to_contain_text("bootstrap")
    expect(page.locator("#principals tbody tr").first).to_contain_text("admin")
    tab.shot("principals")
    assert not tab.errors, tab.errors
    ctx.close()
