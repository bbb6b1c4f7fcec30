"""Fixtures of the router tests: real simulator processes (shared per session, reset per test),
a real local artifact store, and a factory of started ``Router``s that are stopped afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from registry.audit_sink import MemoryAuditSink
from registry.storage.local import LocalArtifactStore
from router.core import Router
from router.settings import PoolConfig, RouterSettings
from simulator.procs import stop_all
from tests.router.routerkit import Sim, http, start_sims, wait_until

N_SIMS = 3


@pytest.fixture(scope="session")
def router_sims() -> Iterator[list[Sim]]:
    sims = start_sims(N_SIMS, "--max-loras", "2")
    try:
        yield sims
    finally:
        stop_all(list(sims))


@pytest.fixture
def sims(router_sims: list[Sim]) -> Iterator[list[Sim]]:
    """The shared simulators, alive, with no faults and no adapters loaded."""
    for s in router_sims:
        if not s.alive():
            s.start()
        s.faults(reset=True)
        for name in s.loaded():
            http().post(f"{s.url}/v1/unload_lora_adapter", json={"lora_name": name})
    yield router_sims
    for s in router_sims:
        with contextlib.suppress(httpx.HTTPError):
            s.faults(reset=True)


@pytest.fixture
def artifacts(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def audit() -> MemoryAuditSink:
    return MemoryAuditSink()


RouterFactory = Callable[..., Awaitable[Router]]


@pytest.fixture
async def make_router(
    tmp_path: Path, artifacts: LocalArtifactStore, audit: MemoryAuditSink
) -> AsyncIterator[RouterFactory]:
    routers: list[Router] = []

    async def factory(
        urls: list[str],
        *,
        max_loras: int = 2,
        max_adapters: int = 4,
        redis: Any = None,
        store: Any = None,
        staging: dict[str, Any] | None = None,
        audit_sink: Any = None,
        wait_healthy: bool = True,
        engine: str = "vllm",
        pool_fields: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> Router:
        pool = PoolConfig(
            name="main",
            base_model="demo-base",
            engine=engine,  # type: ignore[arg-type]
            urls=urls,
            max_loras=max_loras,
            max_adapters=max_adapters,
            staging=staging or {"mode": "local", "dir": str(tmp_path / "staging")},  # type: ignore[arg-type]
            **(pool_fields or {}),
        )
        values: dict[str, Any] = {
            "pools": [pool],
            "data_dir": tmp_path / "data",
            "poll_interval_s": 0.2,
            "poll_timeout_s": 5.0,
            "unhealthy_after": 2,
            "reconcile_interval_s": 0.3,
            "load_timeout_s": 10.0,
            "request_timeout_s": 20.0,
            **overrides,
        }
        settings = RouterSettings(**values)
        r = Router(
            settings,
            store=store or artifacts,
            audit=audit_sink or audit,
            redis=redis,
            registry=CollectorRegistry(),
        )
        routers.append(r)
        await r.start()
        if wait_healthy:  # the machine may be busy: give first polls time
            await wait_until(lambda: r.healthy_count() == len(urls), timeout=30)
        return r

    yield factory
    for r in routers:
        await r.stop()
