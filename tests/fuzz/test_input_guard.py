"""The admin API's input guard (``kit.inputs.InputGuard``) on the bodies that are not plain JSON
objects: a console form, a JSON Lines regression set, a JSON body sent as ``text/plain`` — each
with a NUL is a 422 naming where, before a route runs; a clean one goes through."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kit.inputs import json_problem, text_problem
from registry.api import create_admin_app
from tests.registry.core_support import AUTH, make_settings, seed_adapter, sqlite_template  # noqa: F401

V1 = "/admin/v1"


@pytest.fixture
def c(tmp_path: Path, sqlite_template: Path) -> Iterator[TestClient]:  # noqa: F811
    import shutil

    db = tmp_path / "registry.db"
    shutil.copyfile(sqlite_template, db)
    app = create_admin_app(make_settings(tmp_path, f"sqlite:///{db}"))
    with TestClient(app, headers=AUTH, raise_server_exceptions=False) as client:
        seed_adapter(client, "ad")
        yield client


def _field(r: object) -> str:
    assert getattr(r, "status_code", None) == 422, getattr(r, "text", r)
    body = r.json()  # type: ignore[attr-defined]
    assert body["error"]["code"] == "invalid_request"
    return str(body["error"]["details"]["field"])


def test_console_form_with_nul_is_refused(c: TestClient) -> None:
    assert _field(c.post("/admin/ui/signin", data={"token": "abc\x00def"})) == "form.token"
    # a clean form reaches the console (which answers its own sign-in page)
    assert c.post("/admin/ui/signin", data={"token": "wrong"}).status_code < 500


def test_json_lines_body_is_checked_line_by_line(c: TestClient) -> None:
    h = {"content-type": "application/x-ndjson"}
    ok = b'{"id": "a", "prompt": "hi", "checks": [{"type": "max_chars", "n": 10}]}\n'
    bad = b'{"id": "b", "prompt": "h\\u0000i", "checks": [{"type": "max_chars", "n": 10}]}\n'
    r = c.put(f"{V1}/adapters/ad/regression-set", content=ok + bad, headers=h)
    assert _field(r) == "body.line2.prompt"
    r = c.put(f"{V1}/adapters/ad/regression-set", content=ok, headers=h)
    assert r.status_code in (200, 201), r.text


def test_json_sent_as_text_plain_is_held_to_the_same_rules(c: TestClient) -> None:
    h = {"content-type": "text/plain"}
    assert (
        _field(c.post(f"{V1}/tenants", content=b'{"id": "t", "name": "\\u0000"}', headers=h)) == "body.name"
    )
    # not JSON at all: the route decides (FastAPI's own 422 for a body it cannot read)
    assert c.post(f"{V1}/tenants", content=b"plain words", headers=h).status_code == 422


def test_json_problem_and_text_problem_rules() -> None:
    assert json_problem({"a": [1, "ok\ttab\nline"]}) is None
    where, what = json_problem({"a": [1, "x\x00"]}) or ("", "")
    assert where == "a.1" and what.startswith("must not contain NUL or other control characters")
    assert json_problem({"a": float("inf")}) == ("a", "numbers must be finite")
    deep: object = 0
    for _ in range(33):
        deep = [deep]
    assert json_problem(deep) is not None and json_problem([[[0]]]) is None
    assert text_problem("name\n") is not None and text_problem("text\n", text=True) is None
    assert text_problem("\ud800") is not None and text_problem("ünïcødé ✓") is None
