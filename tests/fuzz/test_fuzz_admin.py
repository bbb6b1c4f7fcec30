"""Schemathesis over the admin API's own ``/admin/v1/openapi.json`` (SPEC §5, §18): no 5xx, on
SQLite and on PostgreSQL (the strict one: NUL bytes and integer ranges), with the bootstrap admin
token, a fixed seed and a bounded number of cases per operation. The live ASGI app is built
like ``loraplane serve --role registry`` builds it, with a real local artifact store; half the
cases name an adapter, tenant, version, principal… that exists, so they reach the database."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from registry.api import create_admin_app
from registry.storage.local import LocalArtifactStore
from tests.fuzz.fuzzer import client_sender, fuzz
from tests.gateway.gw_fakes import FakeRouter
from tests.registry.core_support import (  # noqa: F401 - fixtures
    AUTH,
    add_versions,
    db_url,
    engine,
    factory,
    make_settings,
    pg_migrated,
    seed_adapter,
    sqlite_template,
)

pytestmark = pytest.mark.fuzz

MAX_EXAMPLES = 12  # per operation and generation mode: ~1,000 requests per database


def _seed(c: TestClient, factory: Any) -> dict[str, str]:  # noqa: F811
    """Things that exist, so fuzzed path parameters can name them."""
    seed_adapter(c, "fz")
    add_versions(factory, "fz", 2)
    assert c.post("/admin/v1/tenants", json={"id": "fz"}).status_code == 201
    key = c.post("/admin/v1/tenants/fz/keys").json()
    assert c.put("/admin/v1/tenants/fz/grants/fz", json={}).status_code == 200
    assert (
        c.post(
            "/admin/v1/principals", json={"id": "fz", "role": "maintainer", "owners": ["team-a"]}
        ).status_code
        == 201
    )
    token = c.post("/admin/v1/principals/fz/tokens").json()
    return {
        "adapter_id": "fz",
        "tenant_id": "fz",
        "name": "demo-base",
        "version": "v1",
        "owner": "team-a",
        "principal_id": "fz",
        "key_id": key["key_id"],
        "token_id": token["token_id"],
    }


@pytest.fixture
def admin(tmp_path: Path, db_url: str, engine: Engine) -> Iterator[TestClient]:  # noqa: F811
    settings = make_settings(tmp_path, db_url)
    store = LocalArtifactStore(settings.resolved_artifact_dir())
    app = create_admin_app(settings, engine=engine, store=store, replica_directory=FakeRouter().directory)
    with TestClient(app, headers=AUTH, raise_server_exceptions=False) as c:
        yield c


def test_fuzz_admin_api_finds_no_server_error(admin: TestClient, factory: Any) -> None:  # noqa: F811
    known = _seed(admin, factory)
    schema = schemathesis.openapi.from_asgi("/admin/v1/openapi.json", admin.app)
    logging.disable(logging.ERROR)  # the app logs every refused input; the findings say it all
    try:
        report = fuzz(
            schema,
            client_sender(admin, AUTH),
            base_url="http://testserver",
            max_examples=MAX_EXAMPLES,
            known=known,
        )
    finally:
        logging.disable(logging.NOTSET)
    print(f"{report.operations} operations, {report.requests} requests, statuses {report.statuses}")
    assert report.operations >= 40 and report.requests >= 20 * report.operations, report
    # the fuzzer got past authentication and validation into real work, and was refused too
    assert report.statuses.get(200, 0) + report.statuses.get(201, 0) > 100, report.statuses
    assert report.statuses.get(422, 0) > 100, report.statuses
    assert not report.findings, "\n".join(str(f) for f in report.findings[:20])
