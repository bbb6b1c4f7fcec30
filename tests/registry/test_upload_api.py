"""Uploads through the admin API (SPEC §3, §5, §13): 201 records, 422 ``invalid_adapter`` with
``details.problems``, 413, refused uploads consume no version number and leave nothing behind —
on SQLite and PostgreSQL, with the local store and a real S3 server."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine

from kit.localservices import S3Server
from registry.adapter_factory import write_adapter
from registry.storage.local import LocalArtifactStore
from registry.storage.s3 import S3ArtifactStore
from tests.registry.core_support import (
    AUTH,
    make_settings,
    seed_adapter,
)

V1 = "/admin/v1"
MB = 1024 * 1024


def files_of(d: Path) -> list[tuple[str, tuple[str, bytes]]]:
    return [("files", (p.name, p.read_bytes())) for p in sorted(d.iterdir())]


def local_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def local_client(
    tmp_path: Path,
    db_url: str,
    engine: Engine,
) -> Iterator[tuple[TestClient, LocalArtifactStore]]:
    from registry.api import create_admin_app

    settings = make_settings(tmp_path, db_url, max_adapter_bytes=400_000)
    store = LocalArtifactStore(settings.resolved_artifact_dir())
    with TestClient(create_admin_app(settings, engine=engine, store=store), headers=AUTH) as c:
        seed_adapter(c, "ad")
        yield c, store


def test_upload_records_version_with_hashes(
    local_client: tuple[TestClient, LocalArtifactStore], tmp_path: Path
) -> None:
    c, store = local_client
    d = write_adapter(tmp_path / "a", rank=16, alpha=32, target_modules=["q_proj", "down_proj"])
    r = c.post(f"{V1}/adapters/ad/versions", files=files_of(d))
    assert r.status_code == 201, r.text
    v = r.json()
    assert v["version"] == "v1" and v["status"] == "ready" and v["adapter_id"] == "ad"
    assert (v["rank"], v["lora_alpha"], v["target_modules"]) == (16, 32.0, ["q_proj", "down_proj"])
    want = {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in d.iterdir()}
    assert {f["name"]: (f["size"], f["sha256"]) for f in v["files"]} == want
    assert v["storage_uri"].startswith(store.root.as_uri() + "/adapters/ad/")
    with store.open_read(v["storage_uri"], "adapter_model.safetensors") as f:
        assert hashlib.sha256(f.read()).hexdigest() == want["adapter_model.safetensors"][1]
    events = c.get(f"{V1}/audit", params={"action": "version.uploaded"}).json()["data"]
    assert len(events) == 1 and events[0]["subject_id"] == "ad"


def test_refused_uploads_consume_no_version_number(
    local_client: tuple[TestClient, LocalArtifactStore], tmp_path: Path
) -> None:
    c, store = local_client
    url = f"{V1}/adapters/ad/versions"
    good = write_adapter(tmp_path / "good")
    assert c.post(url, files=files_of(good)).json()["version"] == "v1"
    stored_after_v1 = local_files(store.root)

    # 422 invalid_adapter, every problem listed
    bad = write_adapter(tmp_path / "bad", config_overrides={"use_dora": True, "bias": "all", "r": 4})
    r = c.post(url, files=files_of(bad))
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_adapter"
    problems = err["details"]["problems"]
    assert any("use_dora=True is not supported" in p for p in problems)
    assert any("bias='all' is not supported" in p for p in problems)
    assert any("is not [r, in] with r=4" in p for p in problems)

    # bad filename, duplicate part, missing files: 422 invalid_adapter
    r = c.post(
        url, files=[*files_of(good), ("files", ("../x", b"1")), ("files", ("adapter_config.json", b"{}"))]
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_adapter"
    problems = r.json()["error"]["details"]["problems"]
    assert any("'../x' contains '..'" in p for p in problems)
    assert any("sent twice" in p for p in problems)
    r = c.post(url, files=[("files", ("README.md", b"only this"))])
    assert r.status_code == 422
    assert "missing required file adapter_model.safetensors" in r.json()["error"]["details"]["problems"]

    # 413 over the cap (400 kB here), checked while streaming
    big = write_adapter(tmp_path / "big", pad_bytes=600_000)
    r = c.post(url, files=files_of(big))
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

    # not multipart, not JSON: 422 invalid_request
    r = c.post(url, content=b"raw", headers={"content-type": "application/octet-stream"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"

    # nothing left behind, and the next good upload is v2
    assert local_files(store.root) == stored_after_v1
    assert list(store.pending_dir.iterdir()) == []
    assert c.post(url, files=files_of(good)).json()["version"] == "v2"
    listed = c.get(url).json()["data"]
    assert sorted(v["version"] for v in listed) == ["v1", "v2"]


def test_upload_to_unknown_adapter_is_404(
    local_client: tuple[TestClient, LocalArtifactStore], tmp_path: Path
) -> None:
    c, store = local_client
    r = c.post(f"{V1}/adapters/nope/versions", files=files_of(write_adapter(tmp_path / "a")))
    assert r.status_code == 404
    assert local_files(store.root) == []


@pytest.fixture
def s3_client(
    tmp_path: Path,
    db_url: str,
    engine: Engine,
    s3_server: S3Server,
    s3_bucket: str,
) -> Iterator[tuple[TestClient, S3ArtifactStore]]:
    from registry.api import create_admin_app

    settings = make_settings(
        tmp_path,
        db_url,
        s3_bucket=s3_bucket,
        s3_prefix="reg/",
        s3_endpoint_url=s3_server.endpoint_url,
        s3_access_key_id=s3_server.access_key,
        s3_secret_access_key=SecretStr(s3_server.secret_key),
        allowed_sources=[f"s3://{s3_bucket}/incoming/"],
        max_adapter_bytes=2 * MB,
    )
    app = create_admin_app(settings, engine=engine)
    store = app.state.admin.store
    assert isinstance(store, S3ArtifactStore)
    with TestClient(app, headers=AUTH) as c:
        seed_adapter(c, "ad")
        yield c, store
    store.close()


def bucket_state(server: S3Server, bucket: str, prefix: str) -> list[str]:
    cl = server.client()
    keys = [o["Key"] for o in cl.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    ups = cl.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    return sorted(keys + [f"upload:{u['Key']}" for u in ups])


def test_s3_upload_and_source_registration(
    s3_client: tuple[TestClient, S3ArtifactStore], s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    c, store = s3_client
    url = f"{V1}/adapters/ad/versions"
    d = write_adapter(tmp_path / "a", rank=4)
    v1 = c.post(url, files=files_of(d)).json()
    assert v1["version"] == "v1" and v1["storage_uri"].startswith(f"s3://{s3_bucket}/reg/adapters/ad/")
    after_v1 = bucket_state(s3_server, s3_bucket, "reg/")
    assert len(after_v1) == 2

    # refused: invalid adapter, too big, source outside the allowed prefix / other scheme / '..'
    bad = write_adapter(tmp_path / "bad", config_overrides={"target_modules": "all-linear"})
    r = c.post(url, files=files_of(bad))
    assert r.status_code == 422 and any("all-linear" in p for p in r.json()["error"]["details"]["problems"])
    assert c.post(url, files=files_of(write_adapter(tmp_path / "big", pad_bytes=3 * MB))).status_code == 413
    for src in (
        f"s3://{s3_bucket}/elsewhere/a/",
        f"s3://{s3_bucket}/incoming/../reg/",
        "http://127.0.0.1:1/x/",
        "file:///etc/",
    ):
        r = c.post(url, json={"source_uri": src})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", (src, r.text)
    assert bucket_state(s3_server, s3_bucket, "reg/") == after_v1

    # by reference: copied, so editing the source later changes nothing
    cl = s3_server.client()
    for p in d.iterdir():
        cl.put_object(Bucket=s3_bucket, Key=f"incoming/a/{p.name}", Body=p.read_bytes())
    r = c.post(url, json={"source_uri": f"s3://{s3_bucket}/incoming/a/"})
    assert r.status_code == 201, r.text
    v2 = r.json()
    assert v2["version"] == "v2"
    assert {f["name"]: f["sha256"] for f in v2["files"]} == {f["name"]: f["sha256"] for f in v1["files"]}
    cl.put_object(Bucket=s3_bucket, Key="incoming/a/adapter_model.safetensors", Body=b"tampered")
    with store.open_read(v2["storage_uri"], "adapter_model.safetensors") as f:
        assert f.read() == (d / "adapter_model.safetensors").read_bytes()

    # an invalid source is refused with problems, consumes no number, leaves nothing
    cl.put_object(Bucket=s3_bucket, Key="incoming/bad/adapter_config.json", Body=b'{"peft_type": "LORA"}')
    r = c.post(url, json={"source_uri": f"s3://{s3_bucket}/incoming/bad/"})
    assert r.status_code == 422
    assert "missing required file adapter_model.safetensors" in r.json()["error"]["details"]["problems"]
    assert len(bucket_state(s3_server, s3_bucket, "reg/")) == 4
    assert c.post(url, files=files_of(d)).json()["version"] == "v3"
