"""Artifact stores: local directory and a real S3 server (SeaweedFS)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from kit.errors import InvalidRequest, NotFound, Unavailable
from kit.localservices import S3Server, free_port
from registry.settings import RegistrySettings
from registry.storage import ArtifactStore, make_store
from registry.storage.local import LocalArtifactStore
from registry.storage.s3 import S3ArtifactStore

PART = 5 * 1024 * 1024


def s3_settings(server: S3Server, bucket: str, **over: Any) -> RegistrySettings:
    vals: dict[str, Any] = {
        "s3_bucket": bucket,
        "s3_prefix": "lp/",
        "s3_endpoint_url": server.endpoint_url,
        "s3_access_key_id": server.access_key,
        "s3_secret_access_key": server.secret_key,
        "s3_region": server.region,
        "s3_multipart_chunk_bytes": PART,
    }
    vals.update(over)
    return RegistrySettings(**vals)


def bucket_keys(server: S3Server, bucket: str) -> list[str]:
    resp = server.client().list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in resp.get("Contents", []))


def open_uploads(server: S3Server, bucket: str) -> list[str]:
    return [u["Key"] for u in server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def local_store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def s3_store(s3_server: S3Server, s3_bucket: str) -> Iterator[S3ArtifactStore]:
    store = make_store(s3_settings(s3_server, s3_bucket))
    assert isinstance(store, S3ArtifactStore)
    yield store
    store.close()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> ArtifactStore:
    return request.getfixturevalue(f"{request.param}_store")


def write_file(pending: Any, name: str, data: bytes, chunk: int = 1024 * 1024) -> Any:
    w = pending.writer(name)
    for i in range(0, len(data), chunk):
        w.write(data[i : i + chunk])
    return w.close()


def test_make_store_picks_backend(tmp_path: Path, s3_server: S3Server, s3_bucket: str) -> None:
    local = make_store(RegistrySettings(data_dir=tmp_path))
    assert isinstance(local, LocalArtifactStore) and local.scheme == "file"
    assert local.root == (tmp_path / "artifacts").resolve()
    s3 = make_store(s3_settings(s3_server, s3_bucket))
    assert isinstance(s3, S3ArtifactStore) and s3.scheme == "s3"
    s3.close()


def test_write_commit_read_back(store: ArtifactStore) -> None:
    big = os.urandom(PART + 12345)  # multipart on S3: 2 parts
    small = b'{"r": 8}'
    pending = store.begin("my-adapter")
    infos = [
        write_file(pending, "adapter_model.safetensors", big),
        write_file(pending, "adapter_config.json", small),
    ]
    pending.commit()
    assert infos[0].size == len(big) and infos[0].sha256 == hashlib.sha256(big).hexdigest()
    assert infos[1].size == len(small) and infos[1].sha256 == hashlib.sha256(small).hexdigest()
    assert pending.storage_uri.endswith("/") and "/adapters/my-adapter/" in pending.storage_uri
    assert pending.storage_uri.startswith(f"{store.scheme}://")
    with store.open_read(pending.storage_uri, "adapter_model.safetensors") as f:
        got = hashlib.sha256()
        while chunk := f.read(1 << 20):
            got.update(chunk)
    assert got.hexdigest() == infos[0].sha256
    with store.open_read(pending.storage_uri, "adapter_config.json") as f:
        assert f.read() == small
    with pytest.raises(NotFound):
        store.open_read(pending.storage_uri, "nope.bin")
    store.delete_prefix(pending.storage_uri)
    with pytest.raises(NotFound):
        store.open_read(pending.storage_uri, "adapter_config.json")
    store.delete_prefix(pending.storage_uri)  # idempotent


def test_empty_file(store: ArtifactStore) -> None:
    pending = store.begin("a")
    info = pending.writer("empty.txt").close()
    pending.commit()
    assert info.size == 0 and info.sha256 == hashlib.sha256(b"").hexdigest()
    with store.open_read(pending.storage_uri, "empty.txt") as f:
        assert f.read() == b""


def test_open_read_refuses_foreign_uris(store: ArtifactStore, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest):
        store.open_read(tmp_path.as_uri() + "/", "x")
    with pytest.raises(InvalidRequest):
        store.open_read("s3://other-bucket/lp/adapters/a/x/", "x")
    pending = store.begin("a")
    write_file(pending, "f", b"x")
    pending.commit()
    with pytest.raises(InvalidRequest):
        store.open_read(pending.storage_uri, "../../x")


def test_bad_writer_names_and_ids(store: ArtifactStore) -> None:
    with pytest.raises(InvalidRequest):
        store.begin("../evil")
    pending = store.begin("a")
    with pytest.raises(InvalidRequest):
        pending.writer("sub/x")
    pending.writer("ok")
    with pytest.raises(InvalidRequest):
        pending.writer("ok")
    pending.abort()


# --------------------------------------------------------------------------- nothing left behind


def test_local_abort_leaves_nothing(local_store: LocalArtifactStore) -> None:
    pending = local_store.begin("a")
    write_file(pending, "one", os.urandom(1000))
    w = pending.writer("two")
    w.write(b"partial")  # left open
    pending.abort()
    assert all_files(local_store.root) == []
    assert list(local_store.pending_dir.iterdir()) == []


def test_local_pending_invisible_until_commit(local_store: LocalArtifactStore) -> None:
    pending = local_store.begin("a")
    write_file(pending, "one", b"hello")
    assert not (local_store.root / "adapters").exists()
    pending.commit()
    assert all_files(local_store.root / "adapters") == [
        f"a/{pending.storage_uri.rstrip('/').rsplit('/', 1)[1]}/one"
    ]
    assert list(local_store.pending_dir.iterdir()) == []
    pending.abort()  # abort after commit (e.g. the DB write failed) removes the version too
    assert all_files(local_store.root) == []


def test_s3_abort_leaves_nothing(s3_store: S3ArtifactStore, s3_server: S3Server, s3_bucket: str) -> None:
    pending = s3_store.begin("a")
    write_file(pending, "complete-small", b"x" * 100)
    write_file(pending, "complete-big", os.urandom(PART + 10))
    w = pending.writer("in-flight")
    w.write(os.urandom(PART + 3))  # one part uploaded, multipart upload open
    assert open_uploads(s3_server, s3_bucket) == [pending.key_prefix + "in-flight"]
    assert len(bucket_keys(s3_server, s3_bucket)) == 3  # two files and the upload's lease
    pending.abort()
    assert bucket_keys(s3_server, s3_bucket) == []
    assert open_uploads(s3_server, s3_bucket) == []
    with pytest.raises(Exception, match="aborted"):
        w.write(b"more")


def test_s3_abort_after_commit_deletes(
    s3_store: S3ArtifactStore, s3_server: S3Server, s3_bucket: str
) -> None:
    pending = s3_store.begin("a")
    write_file(pending, "f", b"data")
    pending.commit()
    assert bucket_keys(s3_server, s3_bucket) == [pending.key_prefix + "f"]
    pending.abort()
    assert bucket_keys(s3_server, s3_bucket) == []


def test_s3_parts_stay_bounded(s3_server: S3Server, s3_bucket: str) -> None:
    """Only max_inflight_parts parts are held in flight; all of them end up in the object."""
    store = make_store(s3_settings(s3_server, s3_bucket))
    assert isinstance(store, S3ArtifactStore)
    store.max_inflight_parts = 1
    data = os.urandom(2 * PART + 7)
    pending = store.begin("a")
    info = write_file(pending, "w", data, chunk=PART // 3)
    pending.commit()
    head = s3_server.client().head_object(Bucket=s3_bucket, Key=pending.key_prefix + "w")
    assert head["ContentLength"] == len(data) and head["ETag"].strip('"').endswith("-3")
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    store.close()


def test_s3_down_is_unavailable(tmp_path: Path) -> None:
    settings = RegistrySettings(
        s3_bucket="lp-down",
        s3_endpoint_url=f"http://127.0.0.1:{free_port()}",
        s3_access_key_id="x",
        s3_secret_access_key=SecretStr("y"),
    )
    store = make_store(settings)
    assert isinstance(store, S3ArtifactStore)
    store.client.meta.config.retries = {"max_attempts": 1}
    pending = store.begin("a")
    w = pending.writer("f")
    w.write(b"abc")
    with pytest.raises(Unavailable) as ei:
        w.close()
    assert ei.value.status == 503 and ei.value.code == "storage_unavailable"
    pending.abort()  # must not raise even though S3 is down
    with pytest.raises(Unavailable):
        store.open_read(pending.storage_uri, "f")
    store.close()


def test_s3_wrong_credentials_is_unavailable(s3_server: S3Server, s3_bucket: str) -> None:
    store = make_store(s3_settings(s3_server, s3_bucket, s3_secret_access_key="wrong"))
    pending = store.begin("a")
    w = pending.writer("f")
    w.write(b"abc")
    with pytest.raises(Unavailable):
        w.close()
    pending.abort()
    assert bucket_keys(s3_server, s3_bucket) == []


# --------------------------------------------------------------------------- sources


def test_s3_source_listing_and_reading(
    s3_store: S3ArtifactStore, s3_server: S3Server, s3_bucket: str
) -> None:
    c = s3_server.client()
    c.put_object(Bucket=s3_bucket, Key="src/ad/adapter_config.json", Body=b"{}")
    c.put_object(Bucket=s3_bucket, Key="src/ad/sub/ignored.bin", Body=b"zz")
    c.put_object(Bucket=s3_bucket, Key="src/adx/other", Body=b"no")
    uri = f"s3://{s3_bucket}/src/ad/"
    entries = s3_store.list_source(uri)
    assert [(e.name, e.size) for e in entries] == [("adapter_config.json", 2)]
    with s3_store.open_source(uri, "adapter_config.json") as f:
        assert f.read() == b"{}"
    with pytest.raises(NotFound):
        s3_store.list_source("s3://no-such-bucket-lp/x/")


def test_file_source_listing_skips_links_and_dirs(local_store: LocalArtifactStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.json").write_bytes(b"{}")
    (tmp_path / "secret").write_bytes(b"s")
    (src / "link").symlink_to(tmp_path / "secret")
    entries = local_store.list_source(src.as_uri() + "/")
    assert [(e.name, e.size) for e in entries] == [("a.json", 2)]
    with pytest.raises(InvalidRequest):
        local_store.open_source(src.as_uri() + "/", "link")
    with pytest.raises(NotFound):
        local_store.list_source((tmp_path / "missing").as_uri() + "/")


def test_part_body_reads_and_seeks_across_chunks() -> None:
    from registry.storage.s3_multipart import _PartBody

    data = os.urandom(10_000)
    chunks: list[bytes | memoryview] = [data[:3000], memoryview(data)[3000:3001], data[3001:]]
    body = _PartBody(chunks)

    def read_all(size: int) -> bytes:
        got = bytearray()
        while piece := body.read(size):
            assert 0 < len(piece) <= size
            got += piece
        return bytes(got)

    assert body.size == 10_000 and body.read() == data and body.read(5) == b""
    body.seek(2990)
    assert body.read(20) == data[2990:3000]  # a short read: the rest of the current chunk only
    assert body.read(20) == data[3000:3001] and body.tell() == 3001
    assert body.seek(0, 2) == 10_000 and body.seek(-10, 1) == 9990
    assert body.read(100) == data[9990:]
    for size in (777, 3000, 1 << 20):
        body.seek(0)
        assert read_all(size) == data
    body.seek(0)
    assert body.read(1 << 20) is chunks[0]  # a whole received chunk is handed out as is
    buf = bytearray(4000)
    body.seek(2500)
    assert body.readinto(buf) == 4000 and bytes(buf) == data[2500:6500]


def _s3_crc32(data: bytes) -> str:
    """``x-amz-checksum-crc32`` of ``data`` as S3 defines it: zlib's CRC32, big-endian, base64."""
    import base64
    import zlib

    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_crc32_base64_is_s3s_crc32_of_the_chunks() -> None:
    from registry.storage.s3_multipart import crc32_base64

    data = os.urandom(300_001)
    chunks: list[bytes | memoryview] = [data[:1], memoryview(data)[1:200_000], data[200_000:]]
    assert crc32_base64(chunks) == _s3_crc32(data)
    assert crc32_base64([]) == _s3_crc32(b"")


def _sent_checksums(store: S3ArtifactStore) -> list[tuple[str, str | None, str | None]]:
    """(operation, x-amz-checksum-crc32, content-encoding) of every part/put the store's client sends."""
    seen: list[tuple[str, str | None, str | None]] = []

    def before_send(request: Any, **_: Any) -> None:
        h = request.headers
        enc = h.get("content-encoding")
        seen.append(
            (
                "part" if "partNumber=" in request.url else "put",
                h.get("x-amz-checksum-crc32").decode() if h.get("x-amz-checksum-crc32") else None,
                enc.decode() if isinstance(enc, bytes) else enc,
            )
        )

    store.client.meta.events.register("before-send.s3.UploadPart", before_send)
    store.client.meta.events.register("before-send.s3.PutObject", before_send)
    return seen


def test_s3_parts_carry_the_registrys_own_crc32(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each part (and a small file's single put) goes out with the CRC32 the registry computed
    as a header — botocore computes none of its own, no aws-chunked body — and the object is
    whole."""
    from botocore import httpchecksum

    botocore_passes: list[bytes] = []  # every chunk botocore checksums in this process
    for cls in (httpchecksum.Crc32Checksum, httpchecksum.CrtCrc32Checksum):

        def counting(self: Any, chunk: bytes, _update: Any = cls.update) -> None:
            botocore_passes.append(bytes(chunk))
            _update(self, chunk)

        monkeypatch.setattr(cls, "update", counting)
    store = make_store(s3_settings(s3_server, s3_bucket))
    assert isinstance(store, S3ArtifactStore)
    seen = _sent_checksums(store)
    data = os.urandom(2 * PART + 11)
    small = os.urandom(1000)
    pending = store.begin("a")
    write_file(pending, "w", data, chunk=PART // 3)
    write_file(pending, "small", small)
    pending.commit()

    parts = [data[:PART], data[PART : 2 * PART], data[2 * PART :]]
    want = [("part", _s3_crc32(p), None) for p in parts] + [("put", _s3_crc32(small), None)]
    assert sorted(seen) == sorted(want)
    # botocore read none of the file's bytes to checksum them. (The patch is process-wide: another
    # test's janitor may meanwhile send a DeleteObjects, whose small XML body botocore checksums.)
    ours = [c for c in botocore_passes if c and (c in data or c in small)]
    assert ours == [], [len(c) for c in ours]
    got = s3_server.client().get_object(Bucket=s3_bucket, Key=pending.key_prefix + "w")["Body"].read()
    assert got == data
    store.close()


def test_s3_refuses_a_part_whose_crc32_is_wrong(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checksum the registry sends is checked by S3: a wrong one (simulated: the bytes
    changed after it was computed) fails the upload as storage_unavailable and leaves nothing."""
    import registry.storage.s3_multipart as mp

    real = mp.crc32_base64
    monkeypatch.setattr(mp, "crc32_base64", lambda chunks: real([b"not", *chunks]))
    store = make_store(s3_settings(s3_server, s3_bucket))
    assert isinstance(store, S3ArtifactStore)
    pending = store.begin("a")
    with pytest.raises(Unavailable) as e:
        write_file(pending, "w", os.urandom(2 * PART), chunk=PART // 2)
    assert e.value.code == "storage_unavailable" and "BadDigest" in str(e.value), str(e.value)
    pending.abort()
    assert bucket_keys(s3_server, s3_bucket) == [] and open_uploads(s3_server, s3_bucket) == []
    store.close()
