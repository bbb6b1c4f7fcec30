"""The console's lifecycle buttons of SPEC §19 over HTTP (in-process, a real SQLite registry): End
canary, Enable vN, a Roll back button that is disabled with the reason when rollback would be
refused, and the approvals page that shows a forced request and why a hand gate-setter may not
approve. (The seeded registry: ``benchmarks/console.py`` — v1 active everywhere, every fifth
adapter with a v2 canary at 10 %.)"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kit.db import session_scope
from registry.api.deps import AdminState
from registry.services import adapters as adapter_svc
from registry.services import audit as audit_svc
from registry.services import gates, lifecycle, promotions
from registry.services import principals as principal_svc
from tests.console.test_console_http import CONSOLE, _app, _csrf, _sign_in


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return _app(tmp_path_factory.mktemp("console-lifecycle"))


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield _sign_in(c)


def _button(page: str, label: str) -> str:
    """The HTML of the button labelled ``label`` (``disabled`` or not)."""
    m = re.search(rf"<button[^>]*>{re.escape(label)}</button>", page)
    assert m is not None, label
    return m.group(0)


def test_roll_back_is_disabled_with_the_reason_when_rollback_would_be_refused(client: TestClient) -> None:
    page = client.get(f"{CONSOLE}/adapters/adapter-0001").text  # v1 active, nothing before it
    assert "disabled" in _button(page, "Roll back")
    why = re.search(r'<small class="why" id="why-rollback">([^<]*)</small>', page)
    assert (
        why is not None
        and why.group(1) == "nothing to roll back to: no version before v1 that is not disabled"
    )
    assert "End canary" not in page
    canary = client.get(f"{CONSOLE}/adapters/adapter-0005").text  # v1 active with a v2 canary
    assert "disabled" not in _button(canary, "Roll back") and 'id="why-rollback"' not in canary
    assert "disabled" not in _button(canary, "End canary")


def test_end_canary_previews_then_clears_the_canary_and_keeps_the_active_version(
    app: FastAPI, client: TestClient
) -> None:
    st: AdminState = app.state.admin
    r = client.get(f"{CONSOLE}/adapters/adapter-0010/confirm?action=end_canary")
    assert r.status_code == 200
    assert "Canary: v2 at 10 % → none." in r.text and "Active version" not in r.text
    assert "Confirm: end canary</button>" in r.text
    r = client.post(
        f"{CONSOLE}/adapters/adapter-0010/act", data={"csrf": _csrf(r.text), "action": "end_canary"}
    )
    assert r.status_code == 200 and "End canary: done" in r.text
    assert 'id="canary-version">none' in r.text and 'id="active-version">v1' in r.text
    with session_scope(st.factory) as s:
        [ev] = audit_svc.list_events(s, action="version.canary_cleared", subject_id="adapter-0010").data
    assert (ev.actor, ev.details["version"], ev.details["active_version"]) == ("bootstrap", "v2", "v1")


def test_a_disabled_version_has_an_enable_button_that_takes_it_back_to_ready(
    app: FastAPI, client: TestClient
) -> None:
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        lifecycle.disable_version(s, "adapter-0002", "v2", actor="test")
    page = client.get(f"{CONSOLE}/adapters/adapter-0002").text
    assert "disabled" not in _button(page, "Enable v2") and "Disable v2" not in page
    r = client.get(f"{CONSOLE}/adapters/adapter-0002/confirm?action=enable_version&version=v2")
    assert "Version v2: disabled → ready." in r.text
    r = client.post(
        f"{CONSOLE}/adapters/adapter-0002/act",
        data={"csrf": _csrf(r.text), "action": "enable_version", "version": "v2"},
    )
    assert "Enable version v2: done" in r.text and "Disable v2" in r.text
    with session_scope(st.factory) as s:
        assert adapter_svc.get_version(s, "adapter-0002", "v2").status == "ready"
    # enabling a version that is not disabled is refused with the state machine's own error
    r = client.get(f"{CONSOLE}/adapters/adapter-0002/confirm?action=enable_version&version=v1")
    assert r.status_code == 409 and "conflict" in r.text and "not disabled" in r.text


def test_approvals_page_marks_forced_requests_and_the_hand_gate_setter_cannot_approve(
    app: FastAPI, client: TestClient
) -> None:
    st: AdminState = app.state.admin
    with session_scope(st.factory) as s:
        adapter_svc.update_adapter(s, "adapter-0003", {"approvals_required": 1}, actor="test")
        principal_svc.create_principal(s, principal_id="gia", role="admin", owners=[], actor="test")
        gia = principal_svc.issue_token(s, "gia", actor="test").token
        gates.set_quality_gate(s, "adapter-0003", "v2", "failed", actor="gia")
        out = promotions.promote_or_request(
            s, "adapter-0003", "v2", canary_weight=None, force=True, actor="mia", ttl_s=3600
        )
    assert out.promotion is not None
    pid = out.promotion.id
    inbox = client.get(f"{CONSOLE}/approvals?adapter_id=adapter-0003").text
    row = re.search(rf'<tr data-promotion="{pid}">.*?</tr>', inbox, re.S)
    assert row is not None
    assert '<span class="badge forced"' in row.group(0) and "(gate failed when requested)" in row.group(0)
    assert f"Approve {pid}</button>" in row.group(0)  # bootstrap neither requested nor set the gate
    with TestClient(app) as other:
        _sign_in(other, gia)
        inbox = other.get(f"{CONSOLE}/approvals?adapter_id=adapter-0003").text
        assert "you recorded the quality gate of v2 by hand: another approver must approve it" in inbox
        r = other.post(f"{CONSOLE}/approvals/{pid}/approve", data={"csrf": _csrf(inbox)})
        assert r.status_code == 403 and "gate_setter_approval" in r.text
    page = client.get(f"{CONSOLE}/adapters/adapter-0003").text
    assert "promote v2, forced, 0/1 approvals" in page
