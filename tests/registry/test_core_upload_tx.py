"""The upload route's transaction edge: when the database part fails after the files were
ingested (before or after the pending files were committed), nothing is left behind — no row,
no audit event, no revision bump, no stored file — and the next upload still gets v1."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from kit.db import session_scope
from kit.errors import Conflict
from registry.adapter_factory import write_adapter
from registry.api import routes_upload
from registry.services.snapshot import current_revision
from tests.registry.core_support import (
    AUTH,
    make_settings,
    seed_adapter,
)

V1 = "/admin/v1"


def _files(d: Path) -> list[tuple[str, tuple[str, bytes]]]:
    return [("files", (p.name, p.read_bytes())) for p in sorted(d.iterdir())]


def _stored(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def app_client(tmp_path: Path, db_url: str, engine: Any) -> Iterator[TestClient]:
    from registry.api import create_admin_app

    app = create_admin_app(make_settings(tmp_path, db_url), engine=engine)
    with TestClient(app, headers=AUTH, raise_server_exceptions=False) as c:
        seed_adapter(c, "ad")
        yield c


@pytest.mark.parametrize("failure", ["insert", "commit"])
def test_database_failure_after_ingest_leaves_nothing(
    app_client: TestClient, factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    c = app_client
    store = c.app.state.admin.store  # type: ignore[attr-defined]
    root = Path(store.root)
    with session_scope(factory) as s:
        rev0 = current_revision(s)
    events0 = len(c.get(f"{V1}/audit").json()["data"])
    d = write_adapter(tmp_path / "a")

    if failure == "insert":
        real = routes_upload.register_version

        def failing_register(*args: Any, **kwargs: Any) -> Any:
            real(*args, **kwargs)  # the row and its audit event are flushed …
            raise Conflict("simulated conflict", code="version_conflict")  # … then the change fails

        monkeypatch.setattr(routes_upload, "register_version", failing_register)
        expected = (409, "version_conflict")
    else:
        real_scope = routes_upload.session_scope

        @contextlib.contextmanager
        def failing_commit(f: Any, read_only: bool = False) -> Iterator[Any]:
            if read_only:  # the lookups before the upload read as usual
                with real_scope(f, read_only=True) as session:
                    yield session
                return
            with contextlib.suppress(OperationalError), real_scope(f) as session:
                yield session  # the pending files are committed inside …
                session.flush()
                raise OperationalError("COMMIT", {}, Exception("connection lost at commit"))
            raise OperationalError("COMMIT", {}, Exception("connection lost at commit"))

        monkeypatch.setattr(routes_upload, "session_scope", failing_commit)
        expected = (503, "database_unavailable")

    r = c.post(f"{V1}/adapters/ad/versions", files=_files(d))
    assert (r.status_code, r.json()["error"]["code"]) == expected, r.text
    assert _stored(root) == []  # committed files were removed again
    assert c.get(f"{V1}/adapters/ad/versions").json()["data"] == []
    assert len(c.get(f"{V1}/audit").json()["data"]) == events0
    with session_scope(factory) as s:
        assert current_revision(s) == rev0

    monkeypatch.undo()
    r = c.post(f"{V1}/adapters/ad/versions", files=_files(d))
    assert r.status_code == 201 and r.json()["version"] == "v1"
    assert len(_stored(root)) == 2
