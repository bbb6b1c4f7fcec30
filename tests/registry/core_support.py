"""Fixtures and helpers of the registry-core tests (imported by the ``test_core_*`` modules).

``db_url`` runs a test on SQLite (a copy of a migrated template file) and on PostgreSQL (one
migrated database per module and xdist worker, truncated between tests).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine, text

from kit import localservices as ls
from kit.db import make_engine, make_session_factory
from registry import migrate
from registry.demo import demo_base_model
from registry.settings import RegistrySettings

TOKEN = "admin-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TABLES = "audit_events, grants, api_keys, versions, adapters, tenants, base_models"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tmpl") / "registry.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="module")
def pg_migrated() -> Iterator[str]:
    with ls.temp_pg_database("core") as url:
        migrate.upgrade(url)
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        target = tmp_path / "registry.db"
        shutil.copyfile(template, target)
        return f"sqlite:///{target}"
    url: str = request.getfixturevalue("pg_migrated")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
            conn.execute(text("UPDATE registry_state SET revision = 0"))
    finally:
        engine.dispose()
    return url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def factory(engine: Engine) -> Any:
    return make_session_factory(engine)


def make_settings(tmp_path: Path, db_url: str, **kw: Any) -> RegistrySettings:
    return RegistrySettings(
        data_dir=tmp_path / "data",
        database_url=db_url,
        admin_token=SecretStr(TOKEN),
        **kw,
    )


@pytest.fixture
def client(tmp_path: Path, db_url: str, engine: Engine) -> Iterator[TestClient]:
    from registry.api import create_admin_app

    app = create_admin_app(make_settings(tmp_path, db_url), engine=engine)
    with TestClient(app, headers=AUTH) as c:
        yield c


def seed_adapter(c: TestClient, adapter_id: str = "support", base: str = "demo-base") -> None:
    if c.get(f"/admin/v1/base-models/{base}").status_code == 404:
        assert c.post("/admin/v1/base-models", json=demo_base_model(base)).status_code == 201
    r = c.post("/admin/v1/adapters", json={"id": adapter_id, "base_model": base, "owner": "team-a"})
    assert r.status_code == 201, r.text


def add_versions(factory: Any, adapter_id: str, n: int) -> list[str]:
    """Register ``n`` versions directly through the service (the upload path is tested apart)."""
    from kit.db import session_scope
    from registry.services.versions import register_version

    out = []
    for i in range(n):
        with session_scope(factory) as s:
            rec = register_version(
                s,
                adapter_id,
                rank=8,
                lora_alpha=16.0,
                target_modules=["q_proj", "v_proj"],
                files=[
                    {"name": "adapter_config.json", "size": 10, "sha256": f"{i:064x}"},
                    {"name": "adapter_model.safetensors", "size": 100, "sha256": f"{i + 100:064x}"},
                ],
                storage_uri=f"file:///tmp/nowhere/{adapter_id}/{i}/",
                actor="test",
            )
        out.append(rec.version)
    return out


def statuses(c: TestClient, adapter_id: str) -> dict[str, Any]:
    d = c.get(f"/admin/v1/adapters/{adapter_id}").json()
    return {
        "active": d["active_version"],
        "canary": d["canary_version"],
        "weight": d["canary_weight"],
        "status": d["status"],
        "versions": {v["version"]: (v["status"], v["rollback_to"]) for v in d["versions"]},
    }
