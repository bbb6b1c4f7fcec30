"""Uploads parsed by ``registry.ingest.formdata``, end to end: a malformed body is a 422
``invalid_request`` in the API's error shape and leaves nothing behind (on the local store and a
real S3 server, after parts were already sent), a body over the size cap is a 413 even without a
Content-Length, an RFC preamble and epilogue are ignored."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from registry.adapter_factory import write_adapter
from registry.ingest.common import MULTIPART_SLACK
from registry.storage.local import LocalArtifactStore
from tests.registry import test_ingest_stream
from tests.registry.core_support import AUTH, make_settings, seed_adapter
from tests.registry.test_ingest_stream import (
    BOUNDARY,
    MB,
    Harness,
    adapter_parts,
    multipart,
)

DELIM = f"\r\n--{BOUNDARY}".encode()

# the same store fixtures as the streaming ingest's tests: local and a real S3 server
local_h, s3_h, h = test_ingest_stream.local_h, test_ingest_stream.s3_h, test_ingest_stream.h


async def test_a_delimiter_followed_by_junk_late_in_a_big_file_is_refused(h: Harness, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", pad_bytes=12 * MB)
    body = multipart(adapter_parts(d))
    cut = len(body) - 200_000  # inside the weights: on S3 two 5 MiB parts have been sent
    bad = body[:cut] + DELIM + b"junk" + body[cut:]
    r = await h.post(bad)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request"
    assert err["message"] == "malformed multipart body: a boundary is followed by neither CRLF nor '--'"
    assert h.leftovers() == []


async def test_part_headers_over_the_limits_are_refused(local_h: Harness, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a")
    body = multipart(adapter_parts(d))
    many = "".join(f"X-{i}: v\r\n" for i in range(20)).encode()
    bad = body.replace(b"Content-Type: application/octet-stream\r\n", many, 1)
    r = await local_h.post(bad)
    assert r.status_code == 422
    assert r.json()["error"]["message"] == "malformed multipart body: a part has more than 8 headers"
    assert local_h.leftovers() == []


async def test_an_endless_body_without_content_length_is_cut_at_the_cap(h: Harness, tmp_path: Path) -> None:
    """Without a Content-Length (chunked), bytes outside the parts (here an epilogue) still count."""
    d = write_adapter(tmp_path / "a")
    body = multipart(adapter_parts(d)) + b"e" * (3 * MB)
    h.max_bytes = MB
    assert len(body) > h.max_bytes + MULTIPART_SLACK
    r = await h.post(body, chunk=64 * 1024)  # streamed: httpx sends it chunked
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert h.leftovers() == []


async def test_preamble_and_epilogue_are_ignored(h: Harness, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", pad_bytes=6 * MB)
    body = b"a preamble, to be ignored\r\n" + multipart(adapter_parts(d)) + b"an epilogue, ignored too\r\n"
    r = await h.post(body, chunk=100_003)
    assert r.status_code == 201, r.text
    want = {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in d.iterdir()}
    assert {f["name"]: (f["size"], f["sha256"]) for f in r.json()["files"]} == want


async def test_a_boundary_with_control_characters_is_refused(local_h: Harness) -> None:
    r = await local_h.post(b"--a\tb--\r\n", content_type='multipart/form-data; boundary="a\tb"')
    assert r.status_code == 422
    assert r.json()["error"]["message"] == "multipart/form-data without a valid boundary"


def test_admin_api_refuses_a_malformed_body_in_the_error_shape(
    tmp_path: Path, db_url: str, engine: Engine
) -> None:
    from registry.api import create_admin_app

    settings = make_settings(tmp_path, db_url, max_adapter_bytes=400_000)
    store = LocalArtifactStore(settings.resolved_artifact_dir())
    with TestClient(create_admin_app(settings, engine=engine, store=store), headers=AUTH) as c:
        seed_adapter(c, "ad")
        d = write_adapter(tmp_path / "a")
        body = multipart(adapter_parts(d))
        bad = body.replace(DELIM + b"\r\n", DELIM + b"?\r\n", 1)
        url = "/admin/v1/adapters/ad/versions"
        headers = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
        r = c.post(url, content=bad, headers=headers)
        assert r.status_code == 422
        assert r.json() == {
            "error": {
                "code": "invalid_request",
                "message": "malformed multipart body: a boundary is followed by neither CRLF nor '--'",
                "details": None,
            }
        }
        assert [p for p in store.root.rglob("*") if p.is_file()] == []
        assert c.get(url).json()["data"] == []
        r = c.post(url, content=body, headers=headers)
        assert r.status_code == 201 and r.json()["version"] == "v1"


def test_harness_sends_chunked_bodies_without_content_length() -> None:
    """What the cap test relies on: a streamed httpx body carries no Content-Length."""
    req = httpx.Request("POST", "http://t/upload", content=iter([b"a", b"b"]))
    assert "content-length" not in req.headers and req.headers["transfer-encoding"] == "chunked"
