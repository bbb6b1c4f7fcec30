"""The orphan sweep of both stores and the sweeper thread (S3: the suite's SeaweedFS; the S3
outages themselves are in tests/faults/test_fault_s3.py, on servers those tests stop)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from kit.localservices import S3Server, free_port
from registry.settings import RegistrySettings
from registry.storage import make_store
from registry.storage.local import LocalArtifactStore
from registry.storage.s3 import S3ArtifactStore
from registry.storage.s3_cleanup import Leftover
from registry.storage.s3_leases import lease_key
from registry.storage.sweeper import OrphanSweeper
from tests.registry.test_storage_stores import (
    PART,
    all_files,
    bucket_keys,
    open_uploads,
    s3_settings,
    write_file,
)


class Rows:
    """A ``referenced`` callback: the version rows hold ``uris``; records what it was asked."""

    def __init__(self, *uris: str) -> None:
        self.held = set(uris)
        self.asked: list[str] = []

    def __call__(self, candidates: list[str]) -> set[str]:
        self.asked.extend(candidates)
        return self.held & set(candidates)


def test_s3_sweep_removes_old_orphans_only(s3_server: S3Server, s3_bucket: str) -> None:
    store = make_store(s3_settings(s3_server, s3_bucket))
    assert isinstance(store, S3ArtifactStore)
    client = s3_server.client()
    try:
        kept = store.begin("a")
        write_file(kept, "f", b"row holds me")
        kept.commit()
        orphan = store.begin("a")  # committed files whose database commit never happened
        write_file(orphan, "f", b"no row")
        write_file(orphan, "big", os.urandom(PART + 1))
        orphan.commit()
        dead_key = "lp/adapters/b/deadbeef/adapter_model.safetensors"  # a killed process's upload
        client.create_multipart_upload(Bucket=s3_bucket, Key=dead_key)
        client.put_object(Bucket=s3_bucket, Key="lp/elsewhere/x", Body=b"not ours to judge")
        live = store.begin("c")  # an upload open in this process
        w = live.writer("w")
        w.write(os.urandom(PART + 5))
        live_upload = live.key_prefix + "w"
        assert sorted(open_uploads(s3_server, s3_bucket)) == sorted([dead_key, live_upload])

        referenced = Rows(kept.storage_uri)
        young = store.sweep(referenced, older_than_s=3600)  # everything is younger than an hour
        assert young.prefixes_deleted == [] and young.uploads_aborted == 0
        assert len(bucket_keys(s3_server, s3_bucket)) == 5  # the live upload's lease included

        report = store.sweep(referenced, older_than_s=0)
        assert report.prefixes_deleted == [orphan.storage_uri]
        assert report.objects_deleted == 2 and report.uploads_aborted == 1
        lease = lease_key("lp/", live.key_prefix)
        assert bucket_keys(s3_server, s3_bucket) == sorted([kept.key_prefix + "f", "lp/elsewhere/x", lease])
        assert open_uploads(s3_server, s3_bucket) == [live_upload]
        assert referenced.asked == sorted([kept.storage_uri, orphan.storage_uri])

        w.close()  # the live upload finishes normally after the sweep
        live.commit()
        assert store.open_read(live.storage_uri, "w").read(3)
        assert store.sweep(Rows(kept.storage_uri, live.storage_uri), older_than_s=0).prefixes_deleted == []
    finally:
        store.close()


def test_local_sweep_removes_old_orphans_only(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "artifacts")
    kept = store.begin("a")
    write_file(kept, "f", b"row holds me")
    kept.commit()
    orphan = store.begin("a")
    write_file(orphan, "f", b"no row")
    orphan.commit()
    dead = store.pending_dir / "0123abcd"  # a killed process's pending directory
    dead.mkdir()
    (dead / "adapter_model.safetensors").write_bytes(b"half")
    live = store.begin("b")
    write_file(live, "f", b"in progress")

    assert store.sweep(Rows(kept.storage_uri), older_than_s=3600).prefixes_deleted == []
    report = store.sweep(Rows(kept.storage_uri), older_than_s=0)
    assert report.prefixes_deleted == [orphan.storage_uri]
    assert report.uploads_aborted == 1 and not dead.exists()
    live.commit()
    names = all_files(store.root / "adapters")
    assert len(names) == 2 and all(n.endswith("/f") for n in names)
    assert store.open_read(kept.storage_uri, "f").read() == b"row holds me"


def test_sweeper_runs_at_start_and_survives_failures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalArtifactStore(tmp_path / "artifacts")
    orphan = store.begin("a")
    write_file(orphan, "f", b"x")
    orphan.commit()
    calls = {"n": 0}

    def flaky(uris: list[str]) -> set[str]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("database down")
        return set()

    sweeper = OrphanSweeper(store, flaky, interval_s=0.2, older_than_s=0).start()
    try:
        deadline = time.monotonic() + 20
        while sweeper.sweeps < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sweeper.last is not None and sweeper.last.prefixes_deleted == [orphan.storage_uri]
        assert all_files(store.root / "adapters") == []
    finally:
        sweeper.stop()
    assert any("orphan sweep failed" in r.getMessage() for r in caplog.records)


def test_s3_cleanup_while_down_is_deferred_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    settings = RegistrySettings(
        s3_bucket="lp-down",
        s3_endpoint_url=f"http://127.0.0.1:{free_port()}",
        s3_access_key_id="x",
        s3_secret_access_key=SecretStr("y"),
    )
    store = make_store(settings)
    assert isinstance(store, S3ArtifactStore)
    store.janitor.first_delay = 60  # stays queued for this test
    try:
        with caplog.at_level(logging.WARNING):
            store.clean_up(Leftover("loraplane/adapters/a/t/", uploads={"k": "u"}, keys={"loraplane/x"}))
        assert store.janitor.pending() == 1
        assert any("retrying in the background" in r.getMessage() for r in caplog.records)
    finally:
        store.close()
