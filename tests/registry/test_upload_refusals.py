"""Every way the admin API refuses a version leaves nothing of it behind, on the local store and
on a real S3 server (SPEC §3: "nothing is left behind (no row, no object, no temp file)"; issue
24.14): no file, no upload directory (pending or final), no object, no unfinished multipart
upload, no row — and the next good upload is v1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from kit.errors import Conflict
from kit.localservices import S3Server
from registry.adapter_factory import write_adapter
from registry.api import routes_upload
from registry.storage.local import ADAPTERS_DIR, PENDING_DIR
from tests.registry.core_support import AUTH, make_settings, seed_adapter

URL = "/admin/v1/adapters/ad/versions"
MB = 1024 * 1024
CAP = 400_000
BOUNDARY = "lpb0undary"


@dataclass
class Env:
    client: TestClient
    leftovers: Callable[[], list[str]]
    incoming: Path  # an allowed file:// source directory


def _local_leftovers(root: Path) -> list[str]:
    """Every file, and every directory but the store's own (``.pending``, ``adapters/``, and one
    per adapter): an upload's directory, pending or final, even empty, is a leftover."""
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if p.is_dir() and (
            rel.parts in ((PENDING_DIR,), (ADAPTERS_DIR,))
            or (rel.parts[:1] == (ADAPTERS_DIR,) and len(rel.parts) == 2)
        ):
            continue
        out.append(str(rel))
    return sorted(out)


def _s3_leftovers(server: S3Server, bucket: str) -> list[str]:
    c = server.client()
    keys = [o["Key"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", [])]
    ups = [f"upload:{u['Key']}" for u in c.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return sorted(keys + ups)


@pytest.fixture(params=["local", "s3"])
def env(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> Iterator[Env]:
    from kit.db import make_engine
    from registry.api import create_admin_app

    db = tmp_path / "registry.db"
    db.write_bytes(sqlite_template.read_bytes())
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    kw: dict[str, Any] = {"max_adapter_bytes": CAP, "allowed_sources": [incoming.as_uri() + "/"]}
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        bucket: str = request.getfixturevalue("s3_bucket")
        kw.update(
            s3_bucket=bucket,
            s3_prefix="reg/",
            s3_endpoint_url=server.endpoint_url,
            s3_access_key_id=server.access_key,
            s3_secret_access_key=SecretStr(server.secret_key),
        )
    engine: Engine = make_engine(f"sqlite:///{db}")
    app = create_admin_app(make_settings(tmp_path, f"sqlite:///{db}", **kw), engine=engine)
    store = app.state.admin.store
    if request.param == "s3":
        leftovers = lambda: _s3_leftovers(server, bucket)  # noqa: E731
    else:
        leftovers = lambda: _local_leftovers(Path(store.root))  # noqa: E731
    with TestClient(app, headers=AUTH, raise_server_exceptions=False) as c:
        seed_adapter(c, "ad")
        yield Env(c, leftovers, incoming)
    store.close()
    engine.dispose()


def _parts(d: Path) -> list[tuple[str, tuple[str, bytes]]]:
    return [("files", (p.name, p.read_bytes())) for p in sorted(d.iterdir())]


def _multipart(parts: list[tuple[str, str | None, bytes]], *, close: bool = True) -> bytes:
    out = bytearray()
    for name, filename, data in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + data + b"\r\n"
    if close:
        out += f"--{BOUNDARY}--\r\n".encode()
    return bytes(out)


def _file_parts(d: Path) -> list[tuple[str, str | None, bytes]]:
    return [("files", p.name, p.read_bytes()) for p in sorted(d.iterdir())]


MP = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


def _chunked(body: bytes) -> Iterator[bytes]:  # no Content-Length: the cap is found mid-stream
    for i in range(0, len(body), 64 * 1024):
        yield body[i : i + 64 * 1024]


def _refusals(tmp: Path, incoming: Path) -> list[tuple[str, Callable[[TestClient], Any], int]]:
    good = write_adapter(tmp / "good")
    module_not_in_config = write_adapter(
        tmp / "mod", target_modules=["q_proj", "v_proj"], config_overrides={"target_modules": ["q_proj"]}
    )
    options = write_adapter(tmp / "opts", config_overrides={"use_dora": True, "bias": "all"})
    big = write_adapter(tmp / "big", pad_bytes=600_000)
    config_only = [("files", ("adapter_config.json", (good / "adapter_config.json").read_bytes()))]

    def source(name: str, d: Path, extra: dict[str, bytes] | None = None) -> str:
        target = incoming / name
        target.mkdir()
        for p in d.iterdir():
            (target / p.name).write_bytes(p.read_bytes())
        for fname, data in (extra or {}).items():
            (target / fname).write_bytes(data)
        return target.as_uri() + "/"

    src_mod = source("mod", module_not_in_config)
    src_big = source("big", big)
    src_badname = source("badname", good, {"-x": b"1"})
    return [
        ("tensor module not in config", lambda c: c.post(URL, files=_parts(module_not_in_config)), 422),
        ("options vLLM cannot serve", lambda c: c.post(URL, files=_parts(options)), 422),
        ("only adapter_config.json", lambda c: c.post(URL, files=config_only), 422),
        (
            "bad filename and a duplicate part",
            lambda c: c.post(
                URL,
                files=[*_parts(good), ("files", ("../x", b"1")), ("files", ("adapter_config.json", b"{}"))],
            ),
            422,
        ),
        ("over the cap, announced", lambda c: c.post(URL, files=_parts(big)), 413),
        (
            "over the cap, mid-stream",
            lambda c: c.post(URL, content=_chunked(_multipart(_file_parts(big))), headers=MP),
            413,
        ),
        (
            "malformed multipart",
            lambda c: c.post(
                URL,
                content=_multipart(_file_parts(good)).replace(b"\r\nContent-Disp", b"\r\nX", 1),
                headers=MP,
            ),
            422,
        ),
        (
            "no closing boundary",
            lambda c: c.post(URL, content=_multipart(_file_parts(good), close=False), headers=MP),
            422,
        ),
        (
            "bad quality_gate field after the files",
            lambda c: c.post(
                URL, content=_multipart([*_file_parts(good), ("quality_gate", None, b"bogus")]), headers=MP
            ),
            422,
        ),
        (
            "quality_gate in query and body disagree",
            lambda c: c.post(
                URL,
                params={"quality_gate": "pending"},
                content=_multipart([*_file_parts(good), ("quality_gate", None, b"skipped")]),
                headers=MP,
            ),
            422,
        ),
        ("not multipart", lambda c: c.post(URL, content=b"raw", headers={"content-type": "text/plain"}), 422),
        ("unknown adapter", lambda c: c.post(URL.replace("/ad/", "/nope/"), files=_parts(good)), 404),
        ("source: tensor module not in config", lambda c: c.post(URL, json={"source_uri": src_mod}), 422),
        ("source: over the cap", lambda c: c.post(URL, json={"source_uri": src_big}), 413),
        ("source: a bad file name", lambda c: c.post(URL, json={"source_uri": src_badname}), 422),
        (
            "source: not allowed",
            lambda c: c.post(URL, json={"source_uri": (tmp / "good").as_uri() + "/"}),
            422,
        ),
        (
            "source: gates disagree",
            lambda c: c.post(
                URL,
                params={"quality_gate": "pending"},
                json={"source_uri": src_mod, "quality_gate": "skipped"},
            ),
            422,
        ),
    ]


def test_every_refused_upload_leaves_nothing_and_consumes_no_number(env: Env, tmp_path: Path) -> None:
    c = env.client
    assert env.leftovers() == []
    for what, send, status in _refusals(tmp_path, env.incoming):
        r = send(c)
        assert r.status_code == status, (what, r.status_code, r.text)
        assert env.leftovers() == [], what
    assert c.get(URL).json()["data"] == []
    r = c.post(URL, files=_parts(tmp_path / "good"))
    assert r.status_code == 201 and r.json()["version"] == "v1", r.text


@pytest.mark.parametrize("where", ["insert", "commit", "before recording"])
def test_a_failure_after_the_files_arrived_leaves_nothing(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The database refuses the version (its insert, or its commit after the files were made
    final), or the request ends between ingest and recording (the task cancelled while it waits
    for a worker thread)."""
    c = env.client
    good = write_adapter(tmp_path / "good")
    if where == "insert":
        real = routes_upload.register_version

        def failing_register(*args: Any, **kwargs: Any) -> Any:
            real(*args, **kwargs)
            raise Conflict("simulated conflict", code="version_conflict")

        monkeypatch.setattr(routes_upload, "register_version", failing_register)
        expected = 409
    elif where == "commit":
        real_scope = routes_upload.session_scope

        def failing_scope(f: Any, read_only: bool = False) -> Any:
            import contextlib

            if read_only:  # the lookups before the upload read as usual
                return real_scope(f, read_only=True)

            @contextlib.contextmanager
            def scope() -> Iterator[Any]:
                with contextlib.suppress(OperationalError), real_scope(f) as session:
                    yield session  # the pending files are committed inside …
                    session.flush()
                    raise OperationalError("COMMIT", {}, Exception("connection lost at commit"))
                raise OperationalError("COMMIT", {}, Exception("connection lost at commit"))

            return scope()

        monkeypatch.setattr(routes_upload, "session_scope", failing_scope)
        expected = 503
    else:

        def never_recorded(*args: Any) -> Any:  # e.g. the wait for a worker thread cancelled
            raise RuntimeError("the request ended before the version was recorded")

        monkeypatch.setattr(routes_upload, "_record", never_recorded)
        expected = 500
    r = c.post(URL, files=_parts(good))
    assert r.status_code == expected, r.text
    assert env.leftovers() == []
    monkeypatch.undo()
    assert c.get(URL).json()["data"] == []
    r = c.post(URL, files=_parts(good))
    assert r.status_code == 201 and r.json()["version"] == "v1", r.text
