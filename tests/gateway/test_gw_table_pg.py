"""The routing table on real PostgreSQL: LISTEN/NOTIFY feed latency with two gateway instances,
and serving from the last snapshot when the registry database goes away."""

from __future__ import annotations

import asyncio
import time

import httpx
import psycopg
from pydantic import SecretStr

from gateway.api import create_gateway_app
from gateway.build import snapshot_loader
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.table import RoutingTable
from kit import localservices as ls
from kit.db import make_engine
from registry import migrate
from registry.api import create_admin_app
from registry.feed import PostgresNotifyFeed
from registry.settings import RegistrySettings

from .gw_fakes import FakeRouter, internal_client

TOKEN = "table-test-admin-token"


async def test_two_gateway_tables_follow_changes_within_1s(tmp_path) -> None:
    with ls.temp_pg_database("gwfeed") as url:
        migrate.upgrade(url)
        engine = make_engine(url)
        settings = RegistrySettings(database_url=url, admin_token=SecretStr(TOKEN), data_dir=tmp_path)
        admin = create_admin_app(settings, engine=engine, feed=PostgresNotifyFeed(url))
        tables = [
            RoutingTable(snapshot_loader(make_engine(url)), feed=PostgresNotifyFeed(url), refresh_s=60)
            for _ in range(2)
        ]
        for t in tables:
            await t.start()
        await asyncio.sleep(0.3)  # both LISTEN connections established
        h = {"authorization": f"Bearer {TOKEN}"}
        latencies = []
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=admin), base_url="http://a") as c:
                for i in range(6):
                    r = await c.post("/admin/v1/tenants", json={"id": f"t{i}"}, headers=h)
                    assert r.status_code == 201, r.text
                    t0 = time.perf_counter()
                    for t in tables:
                        async with asyncio.timeout(10.0):
                            while t.snapshot is None or f"t{i}" not in t.snapshot.tenants:
                                await asyncio.sleep(0.001)
                    if i:  # the first change warms connections and code paths up
                        latencies.append(time.perf_counter() - t0)
        finally:
            for t in tables:
                await t.stop()
            engine.dispose()
        print(
            f"\nchange in force on both tables after the admin call: "
            f"median {sorted(latencies)[2] * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
        )
        # Target well under 100 ms (measured ~10-40 ms on an idle machine); the shared 2-core test
        # machine stalls processes now and then, so the bound is on the median, plus a loose max.
        assert sorted(latencies)[len(latencies) // 2] < 1.0
        assert max(latencies) < 3.0
        assert all(t.reloads <= 1 + 6 + 2 for t in tables)  # reloads follow notifications, not a busy loop


async def test_registry_down_keeps_serving_last_snapshot(tmp_path) -> None:
    with ls.temp_pg_database("gwdown") as url:
        migrate.upgrade(url)
        engine = make_engine(url)
        settings = RegistrySettings(database_url=url, admin_token=SecretStr(TOKEN), data_dir=tmp_path)
        admin = create_admin_app(settings, engine=engine, feed=PostgresNotifyFeed(url))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=admin), base_url="http://a") as c:
            h = {"authorization": f"Bearer {TOKEN}"}
            spec = {"name": "demo-base", "hf_id": "x/y", "max_lora_rank": 16, "target_modules": ["q_proj"]}
            assert (await c.post("/admin/v1/base-models", json=spec, headers=h)).status_code == 201
            body = {"id": "acme", "base_model_access": True}
            assert (await c.post("/admin/v1/tenants", json=body, headers=h)).status_code == 201
            key = (await c.post("/admin/v1/tenants/acme/keys", headers=h)).json()["key"]
        gw_engine = make_engine(url)
        router = FakeRouter()
        table = RoutingTable(
            snapshot_loader(gw_engine), on_snapshot=router.update_snapshot, refresh_s=60, retry_s=0.2
        )
        gw = Gateway(GatewaySettings(), router=router, table=table)
        app = create_gateway_app(gw)
        await gw.start()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
        internal = internal_client(gw)
        chat = {"model": "demo-base", "messages": [{"role": "user", "content": "hi"}]}
        r = await client.post("/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200
        # the registry database goes away
        engine.dispose()
        base = ls.pg_server_url().replace("postgresql+psycopg://", "postgresql://") + "/postgres"
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        table.notify()
        async with asyncio.timeout(10):
            while not table.stale:
                await asyncio.sleep(0.02)
        r = await client.post("/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200  # still serving from the last snapshot
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        body = ready.json()  # the public body: codes, no error text (SPEC §19)
        assert body["routing_table"]["stale"] is True and "last_error" not in body["routing_table"]
        assert body["warnings"] == ["routing_snapshot_stale"]  # still ready (SPEC §17)
        detail = await internal.get("/readyz")
        assert detail.json()["routing_table"]["last_error"]
        assert "registry unreachable: serving a stale routing snapshot" in detail.json()["messages"]
        await client.aclose()
        await gw.stop()
        gw_engine.dispose()
