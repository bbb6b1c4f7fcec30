"""Test-only: the gateway app in the test's process on a *real* router and simulator processes.

Between the fake-router unit tests and the whole platform (``gw_platform``): the gateway's ASGI
app, the real ``Router`` (placement, staging, loads, the engine driver) and real simulator
replicas, with a hand-built routing snapshot (adapters stored in a local artifact store, tenant
``acme`` granted all of them). ``serve=True`` also serves the app with uvicorn on a free port, so
a test can be a real HTTP client (and really disconnect).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from gateway.api import GatewayApp, create_gateway_app
from gateway.canary import MemoryCanaryCounters
from gateway.ratelimit import Limiter, MemoryLimiter
from gateway.service import Gateway
from gateway.serving import QuietServer, make_server, wait_started
from gateway.settings import GatewaySettings
from gateway.table import RoutingTable
from kit import localservices as ls
from registry.audit_sink import MemoryAuditSink
from registry.keys import generate_key, hash_key, key_prefix
from registry.snapshot import GrantInfo, KeyInfo, Limits, RoutingSnapshot, TenantInfo, VersionInfo
from registry.storage.local import LocalArtifactStore
from router.core import Router
from router.settings import PoolConfig, RouterSettings
from tests.router.routerkit import put_version, snapshot_of, wait_until


@dataclass
class RealGateway:
    gw: Gateway
    app: GatewayApp
    router: Router
    key: str
    versions: dict[str, VersionInfo]  # adapter id → its active version
    canary: MemoryCanaryCounters
    audit: MemoryAuditSink
    url: str = ""  # when served
    server: QuietServer | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}

    def client(self, **kw: Any) -> httpx.AsyncClient:
        """An HTTP client of the served app (real sockets), or of the ASGI app in process."""
        if self.url:
            return httpx.AsyncClient(base_url=self.url, headers=self.headers(), **kw)
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url="http://gw", headers=self.headers(), **kw)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the gateway's samples of ``name`` whose labels include ``labels``."""
        total = 0.0
        for family in self.gw.metrics.registry.collect():
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total


def access_lines(records: Sequence[logging.LogRecord]) -> list[tuple[int, str | None]]:
    """(status, error) of each access log line (``loraplane.gateway.access``) among ``records``."""
    return [
        (r.__dict__["status"], r.__dict__["error"]) for r in records if r.name == "loraplane.gateway.access"
    ]


def tenant_snapshot(
    versions: Sequence[VersionInfo], *, limits: Limits | None = None, revision: int = 1
) -> tuple[RoutingSnapshot, str]:
    """``snapshot_of(versions)`` plus tenant ``acme`` granted every adapter; returns its key."""
    snap = snapshot_of(*versions, revision=revision)
    key = generate_key()
    tenant = TenantInfo("acme", "Acme", limits or Limits(), True, {a: GrantInfo(a) for a in snap.adapters})
    keys: dict[str, tuple[KeyInfo, ...]] = {
        key_prefix(key): (KeyInfo("k1", "acme", key_prefix(key), hash_key(key)),)
    }
    return dataclasses.replace(snap, tenants={"acme": tenant}, keys_by_prefix=keys), key


def with_canary(snap: RoutingSnapshot, adapter_id: str, canary: VersionInfo, weight: int) -> RoutingSnapshot:
    """``snap`` with ``canary`` (stored already) as ``adapter_id``'s canary at ``weight`` %."""
    a = snap.adapters[adapter_id]
    versions = {**a.versions, canary.version: dataclasses.replace(canary, status="canary")}
    adapters = {
        **snap.adapters,
        adapter_id: dataclasses.replace(
            a, versions=versions, canary_version=canary.version, canary_weight=weight
        ),
    }
    return dataclasses.replace(snap, adapters=adapters)


@contextlib.asynccontextmanager
async def real_gateway(
    tmp_path: Path,
    sim_urls: Sequence[str],
    adapters: Sequence[str],
    *,
    serve: bool = False,
    limits: Limits | None = None,
    limiter: Limiter | None = None,
    adjust: Any = None,  # (snapshot, artifacts, tmp_path) → snapshot, before the gateway starts
    max_adapters: int = 4,
    router: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
) -> AsyncIterator[RealGateway]:
    """A started gateway on a started router; every adapter's v1 active (seeded per adapter)."""
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    versions = {a: put_version(artifacts, tmp_path, a, seed=100 + i) for i, a in enumerate(adapters)}
    snap, key = tenant_snapshot(list(versions.values()), limits=limits)
    if adjust is not None:
        snap = adjust(snap, artifacts, tmp_path)
    pool = PoolConfig(
        name="main", base_model="demo-base", urls=list(sim_urls), max_loras=2, max_adapters=max_adapters,
        staging={"mode": "local", "dir": str(tmp_path / "staging")},  # type: ignore[arg-type]
    )  # fmt: skip
    rsettings = RouterSettings(
        pools=[pool], data_dir=tmp_path / "data", poll_interval_s=0.2, poll_timeout_s=5.0,
        unhealthy_after=2, reconcile_interval_s=0.3, load_timeout_s=10.0, request_timeout_s=20.0,
        **(router or {}),
    )  # fmt: skip
    audit = MemoryAuditSink()
    rtr = Router(rsettings, store=artifacts, audit=audit, registry=CollectorRegistry())
    canary = MemoryCanaryCounters()
    table = RoutingTable(lambda: snap, on_snapshot=rtr.update_snapshot, refresh_s=60)
    gw = Gateway(
        GatewaySettings(admin_token=SecretStr("admin-token-123456789"), **(gateway or {})),
        router=rtr,
        table=table,
        limiter=limiter if limiter is not None else MemoryLimiter(),
        canary=canary,
    )
    app = create_gateway_app(gw, manage_lifecycle=False)
    await gw.start()
    real = RealGateway(gw, app, rtr, key, versions, canary, audit)
    try:
        await wait_until(lambda: rtr.healthy_count() == len(sim_urls), timeout=30)
        if serve:
            port = ls.free_port()
            real.server = make_server(app, "127.0.0.1", port, lifespan="off")
            real.tasks.append(asyncio.create_task(real.server.serve()))
            await wait_started([real.server])
            real.url = f"http://127.0.0.1:{port}"
        yield real
    finally:
        if real.server is not None:
            real.server.should_exit = True
            await asyncio.gather(*real.tasks, return_exceptions=True)
        await gw.stop()
