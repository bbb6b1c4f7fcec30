"""``POST /adapters/{id}/prewarm`` right after the version was created and promoted (issue 24.13):
the admin API answers 202 whether or not the router in its process has seen the registry change
yet (SPEC §13); the prewarm waits in the router, by adapter and version, and is carried out once
its routing snapshot has the version.

Deterministic: the router's snapshot is fed by the test, so the admin API's change has surely
not reached it when the prewarm is asked for. Real parts: the admin app on a migrated SQLite
registry with a local artifact store, the real router on simulator replicas, reading the
artifacts the upload stored."""

from __future__ import annotations

from pathlib import Path

import httpx
from pydantic import SecretStr

from gateway.snapshot_source import make_snapshot_loader
from kit.db import make_engine
from registry import migrate
from registry.adapter_factory import write_adapter
from registry.api import create_admin_app
from registry.demo import demo_base_model
from registry.settings import RegistrySettings
from registry.storage.local import LocalArtifactStore
from router.prewarm import PendingPrewarms
from tests.gateway.gw_fakes import version
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, snapshot_of, wait_until

TOKEN = "admin-token-for-tests-0123456789"
V1 = "/admin/v1"


async def test_prewarm_of_a_version_the_router_has_not_seen_is_202_and_done_once_it_has(
    sims: list[Sim], make_router: RouterFactory, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    store = LocalArtifactStore(tmp_path / "artifacts")
    router = await make_router([s.url for s in sims[:2]], store=store)
    load = make_snapshot_loader(engine)
    router.update_snapshot(load())  # what the router knows: the registry before the change
    settings = RegistrySettings(data_dir=tmp_path / "data", database_url=url, admin_token=SecretStr(TOKEN))
    app = create_admin_app(settings, engine=engine, store=store, replica_directory=router.directory)
    transport = httpx.ASGITransport(app=app)
    headers = {"authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://admin", headers=headers) as c:
            assert (await c.post(f"{V1}/base-models", json=demo_base_model("demo-base"))).status_code == 201
            r = await c.post(f"{V1}/adapters", json={"id": "fresh", "base_model": "demo-base", "owner": "t"})
            assert r.status_code == 201, r.text
            src = write_adapter(tmp_path / "src", rank=8, seed=5, target_modules=("q_proj", "v_proj"))
            files = [
                ("files", (n, (src / n).read_bytes()))
                for n in ("adapter_config.json", "adapter_model.safetensors")
            ]
            r = await c.post(f"{V1}/adapters/fresh/versions", files=files)
            assert r.status_code == 201, r.text
            assert (await c.post(f"{V1}/adapters/fresh/versions/v1/promote")).status_code == 200
            assert router.find_version("fresh", "v1") is None  # the change has not reached it

            r = await c.post(f"{V1}/adapters/fresh/prewarm", json={"replicas": 2})
            assert r.status_code == 202, r.text
            assert r.json() == {"adapter_id": "fresh", "version": "v1", "replicas": 2, "pending": True}

        snap = load()  # the registry change reaches the router
        lora_name = snap.adapters["fresh"].versions["v1"].lora_name
        assert not any(lora_name in s.loaded() for s in sims)
        router.update_snapshot(snap)
        await wait_until(lambda: sum(lora_name in s.loaded() for s in sims[:2]) == 2, timeout=15)
    finally:
        engine.dispose()


def test_pending_prewarms_keep_the_larger_count_run_once_and_expire() -> None:
    p = PendingPrewarms(ttl_s=10)
    p.add("a", "v2", 1, now=0)
    p.add("a", "v2", 3, now=1)
    p.add("b", "v1", 1, now=0)
    empty = snapshot_of()
    assert p.take_ready(empty, now=5) == [] and len(p) == 2  # not there yet, still waiting
    assert p.take_ready(empty, now=10.5) == [] and len(p) == 1  # b's deadline (10) passed: dropped
    a2 = version("a", 2, "active")
    assert p.take_ready(snapshot_of(a2), now=10.6) == [(a2, 3)]  # there now: the larger count
    assert p.take_ready(snapshot_of(a2), now=10.7) == [] and len(p) == 0  # once
