"""Bounded /metrics (gateway.metrics_sweep): the label sets of an adapter version leave the
rendered text once the version is gone from the routing table or idle for the TTL, in the
gateway's request families and the router's per-version / per-replica families; a version in use
keeps its series and their values. Sweeps are driven directly with an injected clock; what is
asserted is the text ``GatewayMetrics.render()`` returns, i.e. what Prometheus scrapes."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from gateway.api import create_gateway_app
from gateway.metrics import GatewayMetrics
from gateway.metrics_sweep import SeriesSweeper, sweeper_for
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.table import RoutingTable
from registry.audit_sink import MemoryAuditSink
from registry.snapshot import RoutingSnapshot
from registry.storage.local import LocalArtifactStore
from router.core import Router
from router.metrics import RouterMetrics
from router.settings import RouterSettings

from .gw_fakes import FakeRouter, adapter, make_snapshot

TTL = 100.0


def sample(text: bytes, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` with exactly ``labels`` in the scraped text, or None."""
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def mentions(text: bytes, adapter_id: str, version: str | None = None) -> bool:
    """Whether any sample of the scraped text carries ``adapter_id`` (and ``version``)."""
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.labels.get("adapter") == adapter_id and version in (None, s.labels.get("version")):
                return True
    return False


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class World:
    """Gateway and router families on one registry, a snapshot of adapters ``a`` (v1, v2) and
    ``b`` (v1) with unique ids, and a sweeper over them with an injected clock."""

    def __init__(self, ttl_s: float = TTL) -> None:
        tag = uuid.uuid4().hex[:8]
        self.a, self.b = f"ret-a-{tag}", f"ret-b-{tag}"
        base, _keys = make_snapshot()
        self.snap: RoutingSnapshot | None = dataclasses.replace(
            base,
            adapters={
                self.a: adapter(self.a, {"v1": "active", "v2": "ready"}, active="v1"),
                self.b: adapter(self.b, {"v1": "active"}, active="v1"),
            },
        )
        self.reg = CollectorRegistry(auto_describe=True)
        self.gm = GatewayMetrics(self.reg)
        self.rm = RouterMetrics(self.reg)
        self.clock = Clock()
        self.replicas: set[str] | None = None
        self.sweeper = SeriesSweeper(
            self.gm,
            ttl_s=ttl_s,
            snapshot=lambda: self.snap,
            router_metrics=self.rm,
            replicas=lambda: self.replicas,
            clock=self.clock,
        )

    def serve(self, adapter_id: str, version: str, tenant: str = "acme", status: int = 200) -> None:
        """What ``GatewayApp._finish`` records for one answer."""
        error = "" if status < 400 else "oops"
        self.gm.count(tenant, adapter_id, version, "chat/completions", status, error)
        if status < 400:
            s = self.gm.series(tenant, adapter_id, version)
            s.latency.observe(0.01)
            s.queue.observe(0.001)
            s.ttft.observe(0.005)
            s.prompt_tokens.inc(7)
            s.completion_tokens.inc(5)

    def requests(self, adapter_id: str, version: str, tenant: str = "acme") -> float | None:
        labels = {"tenant": tenant, "adapter": adapter_id, "version": version, "code": "200"}
        labels["served_version"] = version
        text = self.gm.render()
        return sample(text, "loraplane_gateway_requests_total", **labels, endpoint="chat/completions")

    def drop_adapter(self, adapter_id: str) -> None:
        assert self.snap is not None
        self.snap = dataclasses.replace(
            self.snap, adapters={k: v for k, v in self.snap.adapters.items() if k != adapter_id}
        )

    def drop_version(self, adapter_id: str, version: str) -> None:
        assert self.snap is not None
        info = self.snap.adapters[adapter_id]
        info = dataclasses.replace(info, versions={k: v for k, v in info.versions.items() if k != version})
        self.snap = dataclasses.replace(self.snap, adapters={**self.snap.adapters, adapter_id: info})


# ---------------------------------------------------------------------------- gateway families


def test_version_removed_from_snapshot_disappears_after_sweep() -> None:
    w = World()
    w.serve(w.a, "v1")
    w.serve(w.a, "v1", status=502)
    w.serve(w.b, "v1")
    w.gm.cold_wait.labels(w.a, "v1").observe(0.2)  # as the API records a cold wait
    text = w.gm.render()
    assert mentions(text, w.a, "v1") and mentions(text, w.b, "v1")
    errors = {"tenant": "acme", "adapter": w.a, "version": "v1", "error": "oops"}
    assert sample(text, "loraplane_gateway_errors_total", **errors) == 1.0

    w.drop_adapter(w.a)  # adapter deleted: gone at the next sweep, whatever the TTL
    res = w.sweeper.sweep()
    text = w.gm.render()
    assert not mentions(text, w.a)  # requests, errors, histograms, tokens, cold waits: all of it
    assert w.requests(w.b, "v1") == 1.0  # the other adapter's series are untouched
    assert (res.gone, res.idle, res.versions) == (1, 0, 1)


def test_version_gone_from_adapter_disappears_and_siblings_stay() -> None:
    w = World()
    w.serve(w.a, "v1")
    w.serve(w.a, "v2")
    w.drop_version(w.a, "v1")
    w.sweeper.sweep()
    text = w.gm.render()
    assert not mentions(text, w.a, "v1")
    assert w.requests(w.a, "v2") == 1.0


def test_idle_series_past_ttl_disappears() -> None:
    w = World()
    w.serve(w.a, "v1")
    w.serve(w.b, "v1")
    w.sweeper.sweep()  # both seen in use at t0
    w.clock.t += TTL - 1
    w.serve(w.b, "v1")  # b keeps being served, a does not
    w.sweeper.sweep()
    assert w.requests(w.a, "v1") == 1.0  # idle, but not yet for the TTL
    w.clock.t += 1
    res = w.sweeper.sweep()
    text = w.gm.render()
    assert not mentions(text, w.a)
    assert w.requests(w.b, "v1") == 2.0
    assert (res.gone, res.idle) == (0, 1)


def test_series_in_use_stays_and_keeps_counting() -> None:
    w = World()
    for _ in range(5):  # served every 60 s over 4 TTLs: never idle for a TTL
        for _ in range(3):
            w.serve(w.a, "v1")
        w.sweeper.sweep()
        w.clock.t += TTL * 0.8
    text = w.gm.render()
    labels = {"tenant": "acme", "adapter": w.a, "version": "v1"}
    assert w.requests(w.a, "v1") == 15.0  # one counter all along, never reset
    assert sample(text, "loraplane_gateway_request_seconds_count", **labels) == 15.0
    assert sample(text, "loraplane_gateway_tokens_total", **labels, kind="prompt") == 15 * 7.0


def test_error_answers_alone_keep_a_version_in_use() -> None:
    """Only ``count()`` runs for an error answer (no latency series): that is a use too."""
    w = World()
    w.serve(w.a, "v1")
    w.sweeper.sweep()
    for _ in range(3):
        w.clock.t += TTL * 0.6
        w.serve(w.a, "v1", status=502)
        w.sweeper.sweep()
    text = w.gm.render()
    assert w.requests(w.a, "v1") == 1.0
    labels = {"tenant": "acme", "adapter": w.a, "version": "v1"}
    assert sample(text, "loraplane_gateway_errors_total", **labels, error="oops") == 3.0


def test_one_tenant_in_use_keeps_the_versions_other_series() -> None:
    """The unit is the version: a version still served keeps every tenant's series (per-version
    sums over tenants never drop while it lives)."""
    w = World()
    w.serve(w.a, "v1", tenant="acme")
    w.serve(w.a, "v1", tenant="other")
    w.sweeper.sweep()
    for _ in range(3):
        w.clock.t += TTL * 0.6
        w.serve(w.a, "v1", tenant="acme")
        w.sweeper.sweep()
    assert w.requests(w.a, "v1", tenant="other") == 1.0
    assert w.requests(w.a, "v1", tenant="acme") == 4.0


def test_reserving_after_removal_recreates_from_zero() -> None:
    w = World()
    for _ in range(4):
        w.serve(w.a, "v1")
    w.sweeper.sweep()
    w.clock.t += TTL
    w.sweeper.sweep()
    assert w.requests(w.a, "v1") is None
    w.serve(w.a, "v1")  # the cached children were dropped too: a fresh one, registered again
    text = w.gm.render()
    assert w.requests(w.a, "v1") == 1.0
    labels = {"tenant": "acme", "adapter": w.a, "version": "v1"}
    assert sample(text, "loraplane_gateway_request_seconds_count", **labels) == 1.0
    w.clock.t += 1
    w.sweeper.sweep()
    w.serve(w.a, "v1")
    assert w.requests(w.a, "v1") == 2.0  # and it counts on


def test_ttl_zero_never_expires_idle_series_but_gone_ones_go() -> None:
    w = World(ttl_s=0)
    w.serve(w.a, "v1")
    w.serve(w.b, "v1")
    for _ in range(3):
        w.clock.t += 1e6
        w.sweeper.sweep()
    assert w.requests(w.a, "v1") == 1.0 and w.requests(w.b, "v1") == 1.0
    assert w.sweeper.interval_s == 60.0
    w.drop_adapter(w.b)
    w.sweeper.sweep()
    assert w.requests(w.a, "v1") == 1.0
    assert not mentions(w.gm.render(), w.b)


def test_base_model_series_are_never_gone_only_idle() -> None:
    w = World()
    w.serve("", "")  # the bare base model / a request with no resolved adapter
    w.sweeper.sweep()
    assert w.requests("", "") == 1.0
    w.clock.t += TTL
    w.sweeper.sweep()
    assert w.requests("", "") is None


def test_no_snapshot_yet_drops_nothing_as_gone() -> None:
    w = World()
    w.serve(w.a, "v1")
    w.snap = None
    res = w.sweeper.sweep()
    assert res.gone == 0 and w.requests(w.a, "v1") == 1.0


# ---------------------------------------------------------------------------- router families


def record_load(w: World, replica: str, adapter_id: str, version: str, wait_s: float = 0.5) -> None:
    """What the router's loader records for one load and the request that waited for it."""
    w.rm.loads.labels(replica=replica, adapter=adapter_id, version=version, result="ok").inc()
    w.rm.load_seconds.labels(adapter=adapter_id, version=version).observe(0.3)
    w.rm.cold_wait.labels(adapter=adapter_id, version=version).observe(wait_s)


def test_router_version_families_follow_the_snapshot_and_the_ttl() -> None:
    w = World()
    record_load(w, "http://r1", w.a, "v1")
    record_load(w, "http://r1", w.b, "v1")
    w.rm.unloads.labels(replica="http://r1", adapter=w.a, version="v2", reason="retired").inc()
    w.rm.fallbacks.labels(adapter=w.b, version="v1", kind="base_model", served_version="base").inc()
    w.sweeper.sweep()
    w.drop_version(w.a, "v2")
    w.sweeper.sweep()
    text = w.gm.render()
    assert not mentions(text, w.a, "v2")  # unloads of the gone version
    ok = {"replica": "http://r1", "adapter": w.a, "version": "v1", "result": "ok"}
    assert sample(text, "loraplane_adapter_loads_total", **ok) == 1.0
    fb = {"adapter": w.b, "version": "v1", "kind": "base_model", "served_version": "base"}
    assert sample(text, "loraplane_fallbacks_total", **fb) == 1.0
    w.clock.t += TTL
    w.sweeper.sweep()
    text = w.gm.render()
    assert not mentions(text, w.a) and not mentions(text, w.b)


def test_router_activity_alone_keeps_a_version() -> None:
    """A hot version prewarmed by the router with no request through this gateway is in use."""
    w = World()
    record_load(w, "http://r1", w.a, "v1")
    w.sweeper.sweep()
    w.clock.t += TTL - 1
    w.rm.loads.labels(replica="http://r2", adapter=w.a, version="v1", result="ok").inc()
    w.sweeper.sweep()
    w.clock.t += TTL - 1
    w.rm.cold_wait.labels(adapter=w.a, version="v1").observe(0.0)  # a 0 s wait is a use too
    w.sweeper.sweep()
    w.clock.t += TTL - 1
    w.sweeper.sweep()
    text = w.gm.render()
    ok = {"replica": "http://r1", "adapter": w.a, "version": "v1", "result": "ok"}
    assert sample(text, "loraplane_adapter_loads_total", **ok) == 1.0
    assert sample(text, "loraplane_cold_start_wait_seconds_count", adapter=w.a, version="v1") == 2.0
    w.clock.t += 1
    w.sweeper.sweep()
    assert not mentions(w.gm.render(), w.a)


def test_gateway_traffic_keeps_the_routers_series_of_a_served_version() -> None:
    """A resident version records no loads for hours; its load counters must not reset meanwhile."""
    w = World()
    record_load(w, "http://r1", w.a, "v1")
    for _ in range(4):
        w.serve(w.a, "v1")
        w.sweeper.sweep()
        w.clock.t += TTL * 0.9
    assert sample(w.gm.render(), "loraplane_adapter_load_seconds_count", adapter=w.a, version="v1") == 1.0


def test_replicas_that_left_the_pool_lose_their_series() -> None:
    w = World()
    record_load(w, "http://r1", w.a, "v1")
    record_load(w, "http://r2", w.a, "v1")
    w.rm.wrong_adapter.labels(replica="http://r2").inc()
    w.rm.wrong_adapter.labels(replica="http://r1").inc()
    w.sweeper.sweep()  # replicas unknown (router not started): nothing dropped for them
    assert sample(w.gm.render(), "loraplane_wrong_adapter_answers_total", replica="http://r2") == 1.0
    w.replicas = {"http://r1"}
    res = w.sweeper.sweep()
    text = w.gm.render()
    assert sample(text, "loraplane_wrong_adapter_answers_total", replica="http://r2") is None
    r2 = {"replica": "http://r2", "adapter": w.a, "version": "v1", "result": "ok"}
    assert sample(text, "loraplane_adapter_loads_total", **r2) is None
    assert sample(text, "loraplane_wrong_adapter_answers_total", replica="http://r1") == 1.0
    assert sample(text, "loraplane_adapter_loads_total", **{**r2, "replica": "http://r1"}) == 1.0
    assert res.replicas == 2


# ---------------------------------------------------------------------------- wiring


def test_ttl_setting_default_env_and_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert GatewaySettings().metrics_series_ttl_s == 3600.0
    monkeypatch.setenv("LORAPLANE_METRICS_SERIES_TTL_S", "0")
    assert GatewaySettings().metrics_series_ttl_s == 0.0
    monkeypatch.setenv("LORAPLANE_METRICS_SERIES_TTL_S", "-5")
    with pytest.raises(ValidationError, match="metrics_series_ttl_s"):
        GatewaySettings()
    with pytest.raises(ValueError, match="ttl_s"):
        SeriesSweeper(GatewayMetrics(), ttl_s=-1, snapshot=lambda: None)


def test_sweeper_of_a_real_router_covers_its_families(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    router = Router(
        RouterSettings(), store=LocalArtifactStore(tmp_path), audit=MemoryAuditSink(), registry=reg
    )
    sw = sweeper_for(GatewayMetrics(), router, lambda: None, 3600.0)
    assert sw.router_metrics is router.metrics
    assert sw._replicas is not None and sw._replicas() is None  # not started: pool unknown
    assert sweeper_for(GatewayMetrics(), FakeRouter(), lambda: None, 30.0).router_metrics is None
    assert sw.interval_s == 60.0
    assert sweeper_for(GatewayMetrics(), FakeRouter(), lambda: None, 10.0).interval_s == 10.0


async def test_periodic_task_sweeps_until_stopped() -> None:
    w = World()
    w.sweeper.interval_s = 0.01
    w.serve(w.a, "v1")
    w.sweeper.start()
    try:
        w.drop_adapter(w.a)
        for _ in range(200):
            if w.requests(w.a, "v1") is None:
                break
            await asyncio.sleep(0.01)
        assert w.requests(w.a, "v1") is None
    finally:
        await w.sweeper.stop()
    w.serve(w.b, "v1")
    w.drop_adapter(w.b)
    await asyncio.sleep(0.05)
    assert w.requests(w.b, "v1") == 1.0  # stopped: no more sweeps


class AppEnv:
    def __init__(self) -> None:
        w = World()
        self.a, self.b = w.a, w.b
        base, self.keys = make_snapshot()
        assert w.snap is not None
        self.snap = dataclasses.replace(
            base,
            adapters=w.snap.adapters,
            tenants={
                "acme": dataclasses.replace(
                    base.tenants["acme"],
                    grants={
                        a: dataclasses.replace(base.tenants["acme"].grants["alpha"], adapter_id=a)
                        for a in (self.a, self.b)
                    },
                )
            },
        )
        self.table = RoutingTable(lambda: self.snap, refresh_s=60)
        self.gw = Gateway(GatewaySettings(), router=FakeRouter(), table=self.table)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_gateway_app(self.gw, local=True)), base_url="http://gw"
        )

    async def chat(self, model: str) -> httpx.Response:
        return await self.client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {self.keys['acme']}"},
        )


@pytest.fixture
async def app_env() -> AsyncIterator[AppEnv]:
    e = AppEnv()
    await e.gw.start()
    yield e
    await e.gw.stop()
    await e.client.aclose()


async def test_gateway_requests_series_leave_metrics_when_the_adapter_is_deleted(app_env: AppEnv) -> None:
    e = app_env
    assert e.gw.metrics_sweeper is not None and e.gw.metrics_sweeper.ttl_s == 3600.0
    for model in (f"demo-base:{e.a}", f"demo-base:{e.a}", f"demo-base:{e.b}"):
        assert (await e.chat(model)).status_code == 200
    r = await e.client.get("/metrics")
    assert mentions(r.content, e.a, "v1") and mentions(r.content, e.b, "v1")

    e.snap = dataclasses.replace(
        e.snap, revision=2, adapters={k: v for k, v in e.snap.adapters.items() if k != e.a}
    )
    assert await e.table.reload()
    e.gw.metrics_sweeper.sweep()  # what the periodic task does every minute
    r = await e.client.get("/metrics")
    assert not mentions(r.content, e.a)
    labels = {"tenant": "acme", "adapter": e.b, "version": "v1", "served_version": "v1", "code": "200"}
    assert sample(r.content, "loraplane_gateway_requests_total", **labels, endpoint="chat/completions") == 1.0
    assert (await e.chat(f"demo-base:{e.a}")).status_code == 404  # gone for requests too
    await e.gw.stop()
    assert e.gw.metrics_sweeper is not None and e.gw.metrics_sweeper._task is None
