"""Console sessions end when the admin token is rotated, with or without a configured
``LORAPLANE_CONSOLE_SECRET`` (issue 24.19: with one, an 8 h session used to survive rotation),
and processes that share the token and the secret accept each other's sessions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from benchmarks.console import TOKEN, build_app
from kit.db import make_engine, session_scope
from registry.api import create_admin_app
from registry.services import principals as principal_svc
from registry.settings import RegistrySettings

CONSOLE = "/admin/ui"
ROTATED = "rotated-admin-token-0123456789abcdef"


def _sign_in(client: TestClient, token: str) -> str:
    pre = re.search(r'name="csrf" value="([^"]+)"', client.get(f"{CONSOLE}/signin").text)
    assert pre is not None
    r = client.post(f"{CONSOLE}/signin", data={"csrf": pre.group(1), "token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    cookie = client.cookies.get("lp_console")
    assert cookie
    return cookie


def _process(url: str, data_dir: Path, admin_token: str) -> FastAPI:
    """Another admin API process on the same database (the one restarted with ``admin_token``)."""
    settings = RegistrySettings(data_dir=data_dir, database_url=url, admin_token=SecretStr(admin_token))
    return create_admin_app(settings, engine=make_engine(url))


def _page(app: FastAPI, cookie: str) -> int:
    with TestClient(app) as c:
        c.cookies.set("lp_console", cookie, path=CONSOLE)
        return c.get(f"{CONSOLE}/adapters", follow_redirects=False).status_code


@pytest.mark.parametrize("console_secret", [None, "a-shared-console-secret-0123456789"])
def test_rotating_the_admin_token_signs_every_session_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, console_secret: str | None
) -> None:
    if console_secret is not None:
        monkeypatch.setenv("LORAPLANE_CONSOLE_SECRET", console_secret)
    url = f"sqlite:///{tmp_path}/registry.db"
    app = build_app(url, tmp_path, replicas=1, adapters=2)
    with session_scope(app.state.admin.factory) as s:
        principal_svc.create_principal(s, principal_id="ops-1", role="operator", owners=[], actor="test")
        issued = principal_svc.issue_token(s, "ops-1", actor="test")
    with TestClient(app) as c:
        bootstrap = _sign_in(c, TOKEN)
    with TestClient(app) as c:
        principal = _sign_in(c, issued.token)

    same = _process(url, tmp_path, TOKEN)  # another process, same token (and secret)
    assert _page(same, bootstrap) == 200 and _page(same, principal) == 200
    rotated = _process(url, tmp_path, ROTATED)  # the token rotated: everyone signs in again
    assert _page(rotated, bootstrap) == 303
    assert _page(rotated, principal) == 303
    with TestClient(rotated) as c:
        assert _sign_in(c, ROTATED) and c.get(f"{CONSOLE}/adapters").status_code == 200
