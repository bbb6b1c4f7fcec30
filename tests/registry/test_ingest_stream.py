"""Streaming ingest (multipart and by reference) on the local store and a real S3 server."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kit.errors import InvalidAdapter, InvalidRequest, LoraplaneError, PayloadTooLarge
from kit.localservices import S3Server
from registry.adapter_factory import write_adapter
from registry.demo import demo_base_model
from registry.ingest import check_source_uri, ingest_multipart, ingest_source
from registry.settings import RegistrySettings
from registry.storage import ArtifactStore, make_store
from registry.storage.local import LocalArtifactStore
from registry.storage.s3 import S3ArtifactStore
from registry.validation import BaseModelSpec

BOUNDARY = "lpboundary7d1f"
MB = 1024 * 1024


def base_spec() -> BaseModelSpec:
    b = demo_base_model()
    return BaseModelSpec(b["name"], b["hf_id"], b["max_lora_rank"], b["target_modules"], b["module_shapes"])


def multipart(parts: list[tuple[str, str | None, bytes]]) -> bytes:
    out = bytearray()
    for field, filename, data in parts:
        disp = f'form-data; name="{field}"' + (f'; filename="{filename}"' if filename is not None else "")
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disp}\r\n".encode()
        out += b"Content-Type: application/octet-stream\r\n\r\n"
        out += data + b"\r\n"
    out += f"--{BOUNDARY}--\r\n".encode()
    return bytes(out)


def adapter_parts(d: Path) -> list[tuple[str, str | None, bytes]]:
    return [("files", p.name, p.read_bytes()) for p in sorted(d.iterdir())]


class Harness:
    """A tiny Starlette app around ingest_multipart + a way to check for leftovers."""

    def __init__(self, store: ArtifactStore, leftovers: Any) -> None:
        self.store = store
        self.leftovers = leftovers
        self.max_bytes = 64 * MB

        async def upload(request: Request) -> JSONResponse:
            try:
                res = await ingest_multipart(
                    request, store=store, adapter_id="ad-1", base=base_spec(), max_bytes=self.max_bytes
                )
            except LoraplaneError as e:
                return JSONResponse(e.envelope(), status_code=e.status)
            await asyncio.to_thread(res.pending.commit)
            return JSONResponse(
                {
                    "storage_uri": res.pending.storage_uri,
                    "rank": res.rank,
                    "lora_alpha": res.lora_alpha,
                    "target_modules": res.target_modules,
                    "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in res.files],
                },
                status_code=201,
            )

        self.app = Starlette(routes=[Route("/upload", upload, methods=["POST"])])

    async def post(
        self, body: bytes, content_type: str | None = None, chunk: int = 256 * 1024
    ) -> httpx.Response:
        async def gen() -> Any:
            for i in range(0, len(body), chunk):
                yield body[i : i + chunk]

        headers = {"content-type": content_type or f"multipart/form-data; boundary={BOUNDARY}"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://t") as c:
            return await c.post("/upload", content=gen(), headers=headers)


def local_leftovers(store: LocalArtifactStore) -> list[str]:
    """Every file in the store, and anything inside the pending dir (empty adapter dirs are fine)."""
    files = [p for p in store.root.rglob("*") if p.is_file()]
    pending = list(store.pending_dir.iterdir()) if store.pending_dir.exists() else []
    return sorted(str(p.relative_to(store.root)) for p in files + pending)


def s3_leftovers(server: S3Server, bucket: str) -> list[str]:
    c = server.client()
    keys = [o["Key"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", [])]
    ups = [f"upload:{u['Key']}" for u in c.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return sorted(keys + ups)


def s3_settings(server: S3Server, bucket: str) -> RegistrySettings:
    return RegistrySettings(
        s3_bucket=bucket,
        s3_prefix="store/",
        s3_endpoint_url=server.endpoint_url,
        s3_access_key_id=server.access_key,
        s3_secret_access_key=SecretStr(server.secret_key),
        s3_multipart_chunk_bytes=5 * MB,
    )


@pytest.fixture
def local_h(tmp_path: Path) -> Harness:
    store = LocalArtifactStore(tmp_path / "art")
    return Harness(store, lambda: local_leftovers(store))


@pytest.fixture
def s3_h(s3_server: S3Server, s3_bucket: str) -> Iterator[Harness]:
    store = make_store(s3_settings(s3_server, s3_bucket))
    assert isinstance(store, S3ArtifactStore)
    yield Harness(store, lambda: s3_leftovers(s3_server, s3_bucket))
    store.close()


@pytest.fixture(params=["local", "s3"])
def h(request: pytest.FixtureRequest) -> Harness:
    return request.getfixturevalue(f"{request.param}_h")


# --------------------------------------------------------------------------- multipart


async def test_happy_path_hashes_and_sizes(h: Harness, tmp_path: Path) -> None:
    pad = 6 * MB if isinstance(h.store, S3ArtifactStore) else 2 * MB  # multipart on S3
    d = write_adapter(tmp_path / "a", rank=4, alpha=8, pad_bytes=pad)
    (d / "README.md").write_text("kept too")
    r = await h.post(multipart(adapter_parts(d)))
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["rank"], body["lora_alpha"], body["target_modules"]) == (4, 8.0, ["q_proj", "v_proj"])
    want = {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in d.iterdir()}
    got = {f["name"]: (f["size"], f["sha256"]) for f in body["files"]}
    assert got == want
    for name, (_size, sha) in want.items():
        with h.store.open_read(body["storage_uri"], name) as f:
            assert hashlib.sha256(f.read()).hexdigest() == sha
    h.store.delete_prefix(body["storage_uri"])
    assert h.leftovers() == []


async def test_validation_failure_leaves_nothing(h: Harness, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", config_overrides={"use_dora": True, "r": 99})
    r = await h.post(multipart(adapter_parts(d)))
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_adapter"
    problems = err["details"]["problems"]
    assert any("use_dora" in p for p in problems) and any(
        "r=99 exceeds max_lora_rank 64" in p for p in problems
    )
    assert h.leftovers() == []


async def test_size_cap_mid_stream(h: Harness, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", pad_bytes=600_000)
    h.max_bytes = 300_000
    r = await h.post(multipart(adapter_parts(d)), chunk=64 * 1024)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"
    assert h.leftovers() == []


async def test_size_cap_from_content_length(local_h: Harness) -> None:
    local_h.max_bytes = 1000
    body = multipart([("files", "adapter_config.json", b"x" * (3 * MB))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=local_h.app), base_url="http://t") as c:
        r = await c.post(
            "/upload", content=body, headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
        )
    assert r.status_code == 413
    assert local_h.leftovers() == []


async def test_bad_filenames_duplicates_and_field_names(h: Harness, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a")
    parts = [
        *adapter_parts(d),
        ("files", "../../etc/passwd", b"x"),
        ("files", "dir/x.bin", b"x"),
        ("files", "bad name", b"x"),
        ("files", "adapter_config.json", b"{}"),
        ("file", "other.bin", b"x"),
        ("files", None, b"x"),
    ]
    r = await h.post(multipart(parts))
    assert r.status_code == 422, r.text
    problems = r.json()["error"]["details"]["problems"]
    assert any("'../../etc/passwd' contains '..'" in p for p in problems)
    assert any("'dir/x.bin' is a path" in p for p in problems)
    assert any("'bad name' is not allowed" in p for p in problems)
    assert any("'adapter_config.json' sent twice (duplicate part)" in p for p in problems)
    assert any("part named 'file'" in p for p in problems)
    assert any("has no filename" in p for p in problems)
    assert len(problems) == 6
    assert h.leftovers() == []


async def test_missing_required_files(h: Harness, tmp_path: Path) -> None:
    r = await h.post(multipart([("files", "README.md", b"hi")]))
    assert r.status_code == 422
    problems = r.json()["error"]["details"]["problems"]
    assert "missing required file adapter_config.json" in problems
    assert "missing required file adapter_model.safetensors" in problems
    assert h.leftovers() == []


async def test_not_multipart_and_malformed(local_h: Harness, tmp_path: Path) -> None:
    r = await local_h.post(b'{"a": 1}', content_type="application/json")
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    r = await local_h.post(b"x", content_type="multipart/form-data")
    assert r.status_code == 422 and "boundary" in r.json()["error"]["message"]
    d = write_adapter(tmp_path / "a")
    body = multipart(adapter_parts(d))
    r = await local_h.post(body[: len(body) // 2])  # ends before the closing boundary
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    assert "ended before its closing boundary" in r.json()["error"]["message"]
    r = await local_h.post(b"garbage that is not multipart at all\r\n")
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    assert local_h.leftovers() == []


async def test_client_disconnect_mid_upload(h: Harness, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", pad_bytes=6 * MB)
    body = multipart(adapter_parts(d))
    cut = len(body) - 100_000  # the weights part is well under way (S3: one part uploaded)
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": body[i : min(i + MB, cut)], "more_body": True}
        for i in range(0, cut, MB)
    ]
    messages.append({"type": "http.disconnect"})
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(msg: MutableMapping[str, Any]) -> None:
        sent.append(msg)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/upload",
        "raw_path": b"/upload",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await h.app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 400
    assert b"client_disconnected" in b"".join(m.get("body", b"") for m in sent)
    assert h.leftovers() == []


async def test_storage_error_aborts(s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    settings = s3_settings(s3_server, s3_bucket)
    store = make_store(settings.model_copy(update={"s3_secret_access_key": SecretStr("wrong-secret")}))
    h = Harness(store, lambda: s3_leftovers(s3_server, s3_bucket))
    d = write_adapter(tmp_path / "a")
    r = await h.post(multipart(adapter_parts(d)))
    assert r.status_code == 503 and r.json()["error"]["code"] == "storage_unavailable"
    assert h.leftovers() == []
    assert isinstance(store, S3ArtifactStore)
    store.close()


# --------------------------------------------------------------------------- by reference


@pytest.mark.parametrize(
    ("uri", "allowed", "fragment"),
    [
        ("s3://b/other/x/", ["s3://b/src/"], "not inside an allowed source"),
        ("s3://b/srcx/a/", ["s3://b/src"], "not inside an allowed source"),
        ("s3://b/src/../secret/", ["s3://b/src/"], "must not contain '..'"),
        ("s3://b/src/./a/", ["s3://b/src/"], "must not contain '..' or '.'"),
        ("s3://b/src//a/", ["s3://b/src/"], "empty path segments"),
        ("http://127.0.0.1/x/", ["s3://b/src/"], "only s3://bucket/prefix/"),
        ("gs://b/src/a/", ["gs://b/src/"], "only s3://bucket/prefix/"),
        ("file:///etc/", ["s3://b/src/"], "not inside an allowed source"),
        ("s3://b/src/a%2F..%2F/", ["s3://b/src/"], "not allowed"),
        ("s3://b/src/a/", [], "LORAPLANE_ALLOWED_SOURCES is empty"),
        ("file://host/tmp/x/", ["file://host/tmp/"], "must be file:///absolute/path/"),
    ],
)
def test_source_uri_refused(uri: str, allowed: list[str], fragment: str) -> None:
    with pytest.raises(InvalidRequest) as ei:
        check_source_uri(uri, allowed)
    assert ei.value.status == 422 and ei.value.code == "invalid_request"
    assert fragment in ei.value.message


def test_source_uri_allowed_normalises() -> None:
    assert check_source_uri("s3://b/src/a", ["s3://b/src"]) == "s3://b/src/a/"
    assert check_source_uri("s3://b/src/a/", ["s3://x/", "s3://b/"]) == "s3://b/src/a/"


def test_file_source_symlink_escape_refused(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (tmp_path / "outside").mkdir()
    (allowed / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(InvalidRequest):
        check_source_uri((allowed / "link").as_uri() + "/", [allowed.as_uri() + "/"])


async def test_s3_source_copied_and_pinned(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, s3_h: Harness
) -> None:
    d = write_adapter(tmp_path / "a", rank=4)
    c = s3_server.client()
    for p in d.iterdir():
        c.put_object(Bucket=s3_bucket, Key=f"src/team/a/{p.name}", Body=p.read_bytes())
    res = await ingest_source(
        f"s3://{s3_bucket}/src/team/a",
        allowed_sources=[f"s3://{s3_bucket}/src/"],
        store=s3_h.store,
        adapter_id="ad-1",
        base=base_spec(),
        max_bytes=64 * MB,
    )
    res.pending.commit()
    assert res.rank == 4
    want = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir()}
    assert {f.name: f.sha256 for f in res.files} == want
    # editing the source afterwards does not change the stored version
    c.put_object(Bucket=s3_bucket, Key="src/team/a/adapter_config.json", Body=b'{"tampered": true}')
    with s3_h.store.open_read(res.pending.storage_uri, "adapter_config.json") as f:
        assert hashlib.sha256(f.read()).hexdigest() == want["adapter_config.json"]
    assert res.pending.storage_uri.startswith(f"s3://{s3_bucket}/store/adapters/ad-1/")


async def test_s3_source_invalid_and_too_big_leave_nothing(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, s3_h: Harness
) -> None:
    d = write_adapter(tmp_path / "a", config_overrides={"bias": "all"})
    c = s3_server.client()
    for p in d.iterdir():
        c.put_object(Bucket=s3_bucket, Key=f"src/bad/{p.name}", Body=p.read_bytes())
    before = s3_leftovers(s3_server, s3_bucket)
    kw: dict[str, Any] = {"store": s3_h.store, "adapter_id": "ad-1", "base": base_spec()}
    with pytest.raises(InvalidAdapter) as ei:
        await ingest_source(
            f"s3://{s3_bucket}/src/bad/", allowed_sources=[f"s3://{s3_bucket}/src/"], max_bytes=MB, **kw
        )
    assert any("bias='all'" in p for p in ei.value.problems)
    with pytest.raises(PayloadTooLarge):
        await ingest_source(
            f"s3://{s3_bucket}/src/bad/", allowed_sources=[f"s3://{s3_bucket}/src/"], max_bytes=100, **kw
        )
    with pytest.raises(InvalidRequest):
        await ingest_source(
            f"s3://{s3_bucket}/elsewhere/", allowed_sources=[f"s3://{s3_bucket}/src/"], max_bytes=MB, **kw
        )
    assert s3_leftovers(s3_server, s3_bucket) == before  # only the source objects


async def test_file_source_on_local_store(local_h: Harness, tmp_path: Path) -> None:
    src_root = tmp_path / "sources"
    d = write_adapter(src_root / "a", rank=2)
    store = local_h.store
    kw: dict[str, Any] = {"store": store, "adapter_id": "ad-1", "base": base_spec(), "max_bytes": 64 * MB}
    with pytest.raises(InvalidRequest):  # file:// only when its prefix is listed
        await ingest_source(d.as_uri() + "/", allowed_sources=["s3://b/"], **kw)
    res = await ingest_source(d.as_uri(), allowed_sources=[src_root.as_uri() + "/"], **kw)
    res.pending.commit()
    config = (d / "adapter_config.json").read_bytes()
    (d / "adapter_config.json").write_text(json.dumps({"tampered": True}))
    with store.open_read(res.pending.storage_uri, "adapter_config.json") as f:
        assert f.read() == config
    # a bad source file name is reported, nothing stored
    (d / "adapter_config.json").write_bytes(config)
    (d / "bad name.txt").write_text("x")
    before = local_leftovers(store)  # type: ignore[arg-type]
    with pytest.raises(InvalidAdapter) as ei:
        await ingest_source(d.as_uri(), allowed_sources=[src_root.as_uri() + "/"], **kw)
    assert ei.value.problems == [
        "source file 'bad name.txt': file name 'bad name.txt' is not allowed: "
        "use letters, digits, '.', '_' and '-', starting with a letter or digit"
    ]
    assert local_leftovers(store) == before  # type: ignore[arg-type]


async def test_cancelled_ingest_aborts(local_h: Harness, tmp_path: Path) -> None:
    """A cancelled request task (server shutdown) still leaves nothing behind."""
    d = write_adapter(tmp_path / "a", pad_bytes=4 * MB)
    body = multipart(adapter_parts(d))
    gate = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if receive.n < 3:  # type: ignore[attr-defined]
            receive.n += 1  # type: ignore[attr-defined]
            i = receive.n * MB  # type: ignore[attr-defined]
            return {"type": "http.request", "body": body[i - MB : i], "more_body": True}
        gate.set()
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    receive.n = 0  # type: ignore[attr-defined]
    store = local_h.store

    async def handler() -> None:
        req = Request(
            {
                "type": "http",
                "method": "POST",
                "path": "/",
                "headers": [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())],
                "query_string": b"",
            },
            receive,
        )
        await ingest_multipart(req, store=store, adapter_id="ad-1", base=base_spec(), max_bytes=64 * MB)

    task = asyncio.create_task(handler())
    await asyncio.wait_for(gate.wait(), 60)
    assert isinstance(store, LocalArtifactStore)
    assert any(store.pending_dir.iterdir())  # something was being written
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert local_leftovers(store) == []
