"""S3 faults on an S3 server (SeaweedFS) each test starts itself, never the suite's shared one:

- S3 stopped in the middle of an upload through a real admin API process: 503
  ``storage_unavailable``, no version row; once S3 is back the bucket holds no object and no
  unfinished multipart upload of the failed version (the janitor retries the cleanup), and the
  next upload works without a restart;
- S3 down before an upload starts: the same 503, nothing left;
- a registry SIGKILLed mid-upload leaves an unfinished multipart upload and an object behind; the
  next registry's orphan sweeper removes them and keeps the versions that have a row;
- S3 down during a cold load (the version was never staged): the load fails with 503
  ``adapter_load_failed``, a version already loaded keeps serving, and the cold one loads once S3
  is back.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from kit.localservices import S3Server, start_s3_server
from kit.procs import ManagedProcess, free_port, http_ready, ready_when
from registry import migrate
from registry.adapter_factory import write_adapter
from registry.audit_sink import MemoryAuditSink
from registry.demo import demo_base_model
from registry.storage.s3 import S3ArtifactStore
from router.contract import AdapterLoadFailed
from router.core import Router
from router.settings import PoolConfig, RouterSettings
from simulator.procs import stop_all
from tests.router.routerkit import Sim, chat, put_version, snapshot_of, start_sims, wait_until

pytestmark = pytest.mark.faults

MB = 1024 * 1024
PART = 5 * MB
TOKEN = "fault-" + uuid.uuid4().hex
BOUNDARY = "lpfault" + uuid.uuid4().hex[:12]
SERVER = """
import uvicorn
from registry.api import create_admin_app
from registry.settings import RegistrySettings
uvicorn.run(create_admin_app(RegistrySettings()), host="127.0.0.1", port={port}, log_level="warning")
"""


# --------------------------------------------------------------------------- S3 of our own


@pytest.fixture
def own_s3() -> Iterator[S3Server]:
    if os.environ.get("LORAPLANE_TEST_S3_ENDPOINT"):
        pytest.skip("an external S3 endpoint is configured: these tests stop and restart their own")
    server = start_s3_server(timeout=120)
    try:
        yield server
    finally:
        server.stop()


def stop_s3(server: S3Server) -> None:
    assert server.process is not None
    server.process.stop(grace_s=5)
    assert not server.process.alive()


def restart_s3(server: S3Server, bucket: str) -> None:
    """Start the same SeaweedFS again (same ports, same data directory) and wait until it stores
    and serves objects again (it answers listings a little before its volumes take reads)."""
    assert server.process is not None
    server.process.start()
    client = server.client()

    def serves() -> bool:
        client.list_objects_v2(Bucket=bucket, MaxKeys=1)
        client.put_object(Bucket="lp-ready-probe", Key="restart", Body=b"ok")
        assert client.get_object(Bucket="lp-ready-probe", Key="restart")["Body"].read() == b"ok"
        return True

    server.process.wait_ready(http_ready(f"{server.endpoint_url}/healthz"), timeout=120)
    server.process.wait_ready(ready_when("S3 stores and serves objects", serves), timeout=120)


def leftovers(server: S3Server, bucket: str) -> tuple[list[str], list[str]]:
    """(object keys, keys of unfinished multipart uploads) under the registry's prefix."""
    c = server.client()
    keys = [o["Key"] for o in c.list_objects_v2(Bucket=bucket, Prefix="lp/").get("Contents", [])]
    ups = [u["Key"] for u in c.list_multipart_uploads(Bucket=bucket, Prefix="lp/").get("Uploads", [])]
    return sorted(keys), sorted(ups)


def wait_clean(server: S3Server, bucket: str, keep: set[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        keys, ups = leftovers(server, bucket)
        if not ups and set(keys) == keep:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind after {timeout}s: objects {keys}, uploads {ups}")
        time.sleep(0.5)


# --------------------------------------------------------------------------- a registry process


class Registry:
    def __init__(self, s3: S3Server, bucket: str, workdir: Path, **env: str) -> None:
        db = workdir / "registry.db"
        if not db.exists():
            migrate.upgrade(f"sqlite:///{db}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = dict(
            os.environ,
            LORAPLANE_DATA_DIR=str(workdir / "data"),
            LORAPLANE_DATABASE_URL=f"sqlite:///{db}",
            LORAPLANE_ADMIN_TOKEN=TOKEN,
            LORAPLANE_S3_BUCKET=bucket,
            LORAPLANE_S3_PREFIX="lp/",
            LORAPLANE_S3_ENDPOINT_URL=s3.endpoint_url,
            LORAPLANE_S3_ACCESS_KEY_ID=s3.access_key,
            LORAPLANE_S3_SECRET_ACCESS_KEY=s3.secret_key,
            LORAPLANE_S3_REGION=s3.region,
            LORAPLANE_S3_MULTIPART_CHUNK_BYTES=str(PART),
            LORAPLANE_LOG_LEVEL="INFO",
            **env,
        )
        argv = [sys.executable, "-c", SERVER.format(port=self.port)]
        self.proc = ManagedProcess(argv, env=full_env, log_path=workdir / f"registry-{self.port}.log")
        self.proc.start()
        self.proc.wait_ready(http_ready(f"{self.url}/admin/v1/healthz", timeout=2.0), 120)
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)

    def stop(self) -> None:
        self.http.close()
        self.proc.stop(grace_s=5)

    def versions(self, adapter_id: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/admin/v1/adapters/{adapter_id}/versions")
        assert r.status_code == 200, r.text
        return list(r.json()["data"])


def setup_adapter(reg: Registry, adapter_id: str) -> None:
    r = reg.http.post("/admin/v1/base-models", json=demo_base_model())
    assert r.status_code in (201, 409), r.text
    r = reg.http.post("/admin/v1/adapters", json={"id": adapter_id, "base_model": "demo-base"})
    assert r.status_code == 201, r.text


class Upload:
    """A multipart upload streamed from a thread; it pauses after ``pause_after`` bytes until
    ``resume`` is set (the test breaks something meanwhile)."""

    def __init__(self, reg: Registry, adapter_id: str, files: list[Path], pause_after: int | None) -> None:
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.pause_after = pause_after
        heads = [
            (
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="{p.name}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
            for p in files
        ]
        self.parts = list(zip(heads, files, strict=True))
        self.tail = f"--{BOUNDARY}--\r\n".encode()
        length = sum(len(h) + p.stat().st_size + 2 for h, p in self.parts) + len(self.tail)
        self.headers = {
            "content-type": f"multipart/form-data; boundary={BOUNDARY}",
            "content-length": str(length),
        }
        self._pool = ThreadPoolExecutor(1)
        url = f"/admin/v1/adapters/{adapter_id}/versions"
        self.future: Future[httpx.Response] = self._pool.submit(
            reg.http.post, url, content=self._body(), headers=self.headers
        )

    def _body(self) -> Iterator[bytes]:
        sent = 0
        for head, path in self.parts:
            yield head
            with open(path, "rb") as f:
                while data := f.read(MB):
                    if self.pause_after is not None and sent >= self.pause_after and not self.paused.is_set():
                        self.paused.set()
                        assert self.resume.wait(120)
                    yield data
                    sent += len(data)
            yield b"\r\n"
        yield self.tail

    def result(self, timeout: float = 120) -> httpx.Response:
        try:
            return self.future.result(timeout)
        finally:
            self._pool.shutdown(wait=False)


def adapter_files(tmp_path: Path, name: str, mb: int) -> list[Path]:
    return sorted(write_adapter(tmp_path / name, rank=8, seed=len(name), pad_bytes=mb * MB).iterdir())


# --------------------------------------------------------------------------- uploads


def test_s3_stopped_mid_upload_leaves_nothing_once_back(own_s3: S3Server, tmp_path: Path) -> None:
    bucket = own_s3.create_bucket()
    reg = Registry(own_s3, bucket, tmp_path, LORAPLANE_STORAGE_SWEEP_INTERVAL_S="0")  # the janitor alone
    try:
        setup_adapter(reg, "s3-down")
        files = adapter_files(tmp_path, "big", 24)
        up = Upload(reg, "s3-down", files, pause_after=17 * MB)
        assert up.paused.wait(120)
        time.sleep(1.0)  # the registry has handed the first parts to S3
        stop_s3(own_s3)
        up.resume.set()
        t0 = time.monotonic()
        r = up.result()
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "storage_unavailable"
        assert time.monotonic() - t0 < 60
        assert reg.versions("s3-down") == []  # no version row

        restart_s3(own_s3, bucket)
        wait_clean(own_s3, bucket, keep=set(), timeout=60)  # no object, no unfinished upload

        # recovery without a restart: the same upload now works and keeps exactly its files
        up = Upload(reg, "s3-down", files, pause_after=None)
        r = up.result()
        assert r.status_code == 201, r.text
        v = r.json()
        assert [x["version"] for x in reg.versions("s3-down")] == [v["version"]]
        prefix = v["storage_uri"].removeprefix(f"s3://{bucket}/")
        wait_clean(own_s3, bucket, keep={prefix + f.name for f in files}, timeout=10)
    finally:
        reg.stop()


def test_s3_down_before_upload_is_503_and_nothing_left(own_s3: S3Server, tmp_path: Path) -> None:
    bucket = own_s3.create_bucket()
    reg = Registry(own_s3, bucket, tmp_path, LORAPLANE_STORAGE_SWEEP_INTERVAL_S="0")
    try:
        setup_adapter(reg, "s3-gone")
        files = adapter_files(tmp_path, "small", 0)
        stop_s3(own_s3)
        r = Upload(reg, "s3-gone", files, pause_after=None).result()
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "storage_unavailable"
        assert reg.versions("s3-gone") == []
        restart_s3(own_s3, bucket)
        wait_clean(own_s3, bucket, keep=set(), timeout=30)
    finally:
        reg.stop()


def test_killed_registry_leftovers_are_swept_at_next_start(own_s3: S3Server, tmp_path: Path) -> None:
    bucket = own_s3.create_bucket()
    first = Registry(own_s3, bucket, tmp_path, LORAPLANE_STORAGE_SWEEP_INTERVAL_S="0")
    try:
        setup_adapter(first, "killed")
        kept = Upload(first, "killed", adapter_files(tmp_path, "kept", 0), pause_after=None).result()
        assert kept.status_code == 201, kept.text
        kept_prefix = kept.json()["storage_uri"].removeprefix(f"s3://{bucket}/")
        up = Upload(first, "killed", adapter_files(tmp_path, "doomed", 16), pause_after=12 * MB)
        assert up.paused.wait(120)
        time.sleep(1.5)  # parts handed to S3

        def orphans_present() -> bool:
            keys, ups = leftovers(own_s3, bucket)
            return bool(ups) and any(not k.startswith(kept_prefix) for k in keys)

        first.proc.wait_ready(ready_when("parts reached S3", orphans_present), timeout=60)
        first.proc.kill()  # no abort, no cleanup: a crash
        up.resume.set()
        with pytest.raises(httpx.TransportError):
            up.result()
    finally:
        first.stop()
    keys, ups = leftovers(own_s3, bucket)
    assert ups and len(keys) > 2, (keys, ups)  # the crash left an object and an unfinished upload

    time.sleep(1.0)  # older than the bound below
    second = Registry(
        own_s3,
        bucket,
        tmp_path,
        LORAPLANE_STORAGE_SWEEP_INTERVAL_S="1",
        LORAPLANE_STORAGE_ORPHAN_AGE_S="1",
    )
    try:
        names = ("adapter_config.json", "adapter_model.safetensors")
        wait_clean(own_s3, bucket, keep={kept_prefix + n for n in names})
        assert [v["version"] for v in second.versions("killed")] == [kept.json()["version"]]
        # the sweeper leaves uploads in progress alone, however old the bound says
        up = Upload(second, "killed", adapter_files(tmp_path, "late", 12), pause_after=8 * MB)
        assert up.paused.wait(120)
        time.sleep(3.0)  # several sweeps pass while the upload is open
        up.resume.set()
        r = up.result()
        assert r.status_code == 201, r.text
        assert len(second.versions("killed")) == 2
    finally:
        second.stop()


# --------------------------------------------------------------------------- cold load


@pytest.fixture
def one_sim() -> Iterator[Sim]:
    sims = start_sims(1, "--max-loras", "2")
    try:
        yield sims[0]
    finally:
        stop_all(list(sims))


async def test_s3_down_during_cold_load(own_s3: S3Server, one_sim: Sim, tmp_path: Path) -> None:
    bucket = own_s3.create_bucket()
    store = S3ArtifactStore(own_s3.client(), bucket, "lp/")
    warm = put_version(store, tmp_path, "warm", seed=3)
    cold = put_version(store, tmp_path, "cold", seed=4)
    pool = PoolConfig(
        name="main",
        base_model="demo-base",
        urls=[one_sim.url],
        max_loras=2,
        max_adapters=4,
        staging={"mode": "local", "dir": str(tmp_path / "staging")},  # type: ignore[arg-type]
    )
    settings = RouterSettings(
        pools=[pool],
        data_dir=tmp_path / "data",
        poll_interval_s=0.2,
        poll_timeout_s=5.0,
        load_timeout_s=20.0,
        request_timeout_s=20.0,
    )
    router = Router(settings, store=store, audit=MemoryAuditSink(), registry=CollectorRegistry())
    await router.start()
    try:
        await wait_until(lambda: router.healthy_count() == 1, timeout=30)
        router.update_snapshot(snapshot_of(warm, cold))
        assert (await router.forward(chat(warm))).status == 200  # staged and loaded

        stop_s3(own_s3)
        with pytest.raises(AdapterLoadFailed) as failed:
            await router.forward(chat(cold))
        assert failed.value.status == 503 and failed.value.code == "adapter_load_failed"
        assert cold.lora_name not in one_sim.loaded()
        assert (await router.forward(chat(warm))).status == 200  # what is loaded keeps serving
        staged = [p.name for p in (tmp_path / "staging").iterdir()]
        assert cold.lora_name not in staged and not [n for n in staged if n.startswith(".tmp")], staged

        restart_s3(own_s3, bucket)
        assert (await router.forward(chat(cold))).status == 200  # no restart of the router needed
        assert cold.lora_name in one_sim.loaded()
    finally:
        await router.stop()
        store.close()
