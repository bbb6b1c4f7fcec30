"""No console route answers 500 for bad input (issue 24.17; the console is outside the OpenAPI
document the fuzzer reads): every route of the console's router — enumerated from the app, so a
new route is covered without touching this file — is driven, signed in as the admin, with
hostile path, query and form values: dates that overflow when converted to UTC, NUL and other
control characters, lone surrogates (percent-encoded as a client sends them), huge and negative
integers, very long strings. Every answer is below 500, and a refused one (4xx) writes nothing
(every write of the registry is audited: the audit log does not grow).

First every route gets every fixed hostile value in every parameter (the regressions), then
hypothesis draws routes and values.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.console.web import BASE, HERE
from tests.console.test_console_http import _app, _csrf, _sign_in

HOSTILE = [
    "0001-01-01T00:00:00+14:00",  # the reported one: before year 1 in UTC
    "9999-12-31T23:59:59-14:00",  # after year 9999 in UTC
    "0001-01-01",
    "9999-12-31T23:59:59.999999",
    "2026-13-45T25:61:61",
    "\x00",
    "a\x00b",
    "\x01\x07\x1b[31m\x7f",
    "\r\nSet-Cookie: x=1",
    "\ud800",  # a lone surrogate
    "x\udfffy",
    "9" * 400,
    str(2**63),
    str(-(2**63) - 1),
    "-1",
    "-0",
    "1e309",
    "NaN",
    "inf",
    "-inf",
    "0x10",
    "x" * 6_000,  # every query parameter at once stays under the client's URL limit
    "../../etc/passwd",
    "%00",
    "<script>alert(1)</script>",
    "' OR 1=1 --",
    "",
    " ",
    "asc",
    "desc",
]
REAL_IDS = ["adapter-0001", "tenant-01"]
# every form field a console page has, and the names the handlers read
FIELDS = sorted(
    set(re.findall(r'name="([a-z_]+)"', "".join(p.read_text() for p in (HERE / "templates").glob("*.html"))))
    | {"action", "version", "weight", "comment", "token", "next", "decision", "name", "limits"}
)


@dataclass(frozen=True)
class RouteInfo:
    path: str
    methods: frozenset[str]
    query: tuple[str, ...]  # the query parameters it declares


def _walk(routes: list[Any], prefix: str = "") -> Iterator[RouteInfo]:
    for r in routes:
        if isinstance(r, APIRoute):
            names = tuple(p.alias for p in r.dependant.query_params)
            yield RouteInfo(prefix + r.path, frozenset(r.methods or ()), names)
        elif hasattr(r, "include_context"):  # FastAPI's lazily included router
            ctx = r.include_context
            yield from _walk(list(ctx.included_router.routes), prefix + ctx.prefix)


def console_routes(app: FastAPI) -> list[RouteInfo]:
    """Every route of the console, from the app's own router (a new one is covered at once)."""
    return sorted((r for r in _walk(list(app.routes)) if r.path.startswith(BASE)), key=lambda r: r.path)


def enc(value: str) -> str:
    return quote(value, safe="", errors="surrogatepass")


def fill(path: str, value: str) -> str:
    return re.sub(r"\{[^}]+\}", enc(value), path)


@pytest.fixture(scope="module")
def where(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-hostile")


@pytest.fixture(scope="module")
def app(where: Path) -> FastAPI:
    return _app(where)  # a SQLite registry at where/registry.db


@pytest.fixture(scope="module")
def db(app: FastAPI, where: Path) -> Path:
    return where / "registry.db"


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as c:
        yield _sign_in(c)


def audit_count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM audit_events").fetchone()[0])


class Prober:
    def __init__(self, client: TestClient, db: Path) -> None:
        self.client = client
        self.db = db
        self._csrf = _csrf(client.get(f"{BASE}/adapters").text)

    def get(self, route: RouteInfo, path_value: str, query: dict[str, str]) -> None:
        names = list(route.query)
        qs = "&".join(f"{enc(k)}={enc(v)}" for k, v in query.items() if k in names or not names)
        url = fill(route.path, path_value) + (f"?{qs}" if qs else "")
        r = self.client.get(url, follow_redirects=False)
        assert r.status_code < 500, (url[:300], r.status_code, r.text[:500])

    def post(self, route: RouteInfo, path_value: str, form: dict[str, str]) -> None:
        if route.path.endswith("/signout") or route.path.endswith("/signin"):
            return  # signing out (or in again) is not a write of the registry; covered elsewhere
        url = fill(route.path, path_value)
        body = "&".join(f"{enc(k)}={enc(v)}" for k, v in {"csrf": self._csrf, **form}.items())
        before = audit_count(self.db)
        r = self.client.post(
            url,
            content=body.encode("ascii"),
            headers={"content-type": "application/x-www-form-urlencoded"},
            follow_redirects=False,
        )
        assert r.status_code < 500, (url[:300], sorted(form)[:5], r.status_code, r.text[:500])
        if r.status_code >= 400:
            assert audit_count(self.db) == before, (url[:300], r.status_code, "refused, yet written")


@pytest.fixture(scope="module")
def prober(client: TestClient, db: Path) -> Prober:
    return Prober(client, db)


def test_every_console_route_is_enumerated(app: FastAPI) -> None:
    routes = console_routes(app)
    methods = {m for r in routes for m in r.methods}
    assert len(routes) >= 15 and {"GET", "POST"} <= methods, [r.path for r in routes]
    assert any(r.path == f"{BASE}/audit" for r in routes)


def test_every_console_route_survives_every_fixed_hostile_value(app: FastAPI, prober: Prober) -> None:
    for route in console_routes(app):
        for value in HOSTILE:
            ids = [value] if "{" in route.path else [""]
            for path_value in [*ids, *REAL_IDS] if "{" in route.path else ids:
                if "GET" in route.methods:
                    names = list(route.query) or ["q"]
                    prober.get(route, path_value, dict.fromkeys(names, value))
                    for name in names:  # one hostile parameter at a time, the others absent
                        prober.get(route, path_value, {name: value})
                if "POST" in route.methods:
                    prober.post(route, path_value, dict.fromkeys(FIELDS, value))
                if path_value != value:
                    break  # the real ids once per route are enough


hostile_text = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=60),
    st.text(alphabet=st.characters(codec=None, categories=("Cc", "Cs", "Zs", "Nd")), max_size=30),
    st.integers().map(str),
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.floats().map(str),
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hypothesis_drives_console_routes_with_hostile_values(
    app: FastAPI, prober: Prober, data: st.DataObject
) -> None:
    route = data.draw(st.sampled_from(console_routes(app)), label="route")
    path_value = data.draw(st.one_of(st.sampled_from(REAL_IDS), hostile_text), label="path")
    if "GET" in route.methods:
        names = list(route.query) or ["q"]
        query = data.draw(
            st.dictionaries(st.sampled_from(names), hostile_text, max_size=len(names)), label="q"
        )
        prober.get(route, path_value, query)
    if "POST" in route.methods:
        form = data.draw(
            st.dictionaries(st.sampled_from(FIELDS), hostile_text, max_size=len(FIELDS)), label="f"
        )
        prober.post(route, path_value, form)
