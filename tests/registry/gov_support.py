"""Helpers of the governance tests (``test_gov_*``): principals with tokens, and clients that
call the admin API as them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from tests.registry.core_support import AUTH, make_settings

V1 = "/admin/v1"


def _clear_principals(engine: Engine) -> None:
    """The shared PostgreSQL database of a module keeps principals between tests; start clean."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM principal_tokens"))
        conn.execute(text("DELETE FROM principals"))
        conn.execute(text("DELETE FROM promotion_requests"))


@pytest.fixture(name="gov_client")
def gov_client_fixture(tmp_path: Path, db_url: str, engine: Engine) -> Iterator[TestClient]:
    """The admin API as the bootstrap admin (``LORAPLANE_ADMIN_TOKEN``)."""
    from registry.api import create_admin_app

    _clear_principals(engine)
    app = create_admin_app(make_settings(tmp_path, db_url), engine=engine)
    with TestClient(app, headers=AUTH) as c:
        yield c


def make_principal(admin: TestClient, pid: str, role: str, owners: list[str] | None = None) -> str:
    """Create a principal and return a fresh token of it."""
    r = admin.post(f"{V1}/principals", json={"id": pid, "role": role, "owners": owners or []})
    assert r.status_code == 201, r.text
    r = admin.post(f"{V1}/principals/{pid}/tokens")
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


def as_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error_of(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == code, err
    return err
