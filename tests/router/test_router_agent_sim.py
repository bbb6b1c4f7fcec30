"""``loraplane agent`` staging mode end to end (real agent HTTP server, real simulator), and the
agent's own guards (token, names, hashes)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from kit.localservices import free_port
from registry.audit_sink import MemoryAuditSink
from router.agent import make_app
from router.contract import AdapterLoadFailed
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of

pytestmark = pytest.mark.xdist_group("router-sims")

TOKEN = "agent-secret"


@pytest.fixture
async def agent_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path, int]]:
    root = tmp_path / "replica-volume"
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(make_app(root, TOKEN), host="127.0.0.1", port=port, log_level="error", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", root, port
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


async def test_agent_staging_end_to_end(
    sims: list[Sim],
    make_router: RouterFactory,
    artifacts,
    audit: MemoryAuditSink,
    tmp_path: Path,
    agent_server: tuple[str, Path, int],
) -> None:
    _, root, port = agent_server
    staging = {"mode": "agent", "url_template": f"http://{{host}}:{port}", "token": TOKEN}
    v = put_version(artifacts, tmp_path, "agented", seed=80)
    router = await make_router([sims[0].url], staging=staging)
    router.update_snapshot(snapshot_of(v))
    res = await router.forward(chat(v))
    assert res.status == 200 and res.cold_load
    staged = root.resolve() / v.lora_name
    for f in v.files:
        assert hashlib.sha256((staged / f.name).read_bytes()).hexdigest() == f.sha256
    paths = {a["name"]: a["path"] for a in sims[0].state()["adapters"]}
    assert paths[v.lora_name] == str(staged)
    assert not any(p.name.startswith(".tmp") for p in root.iterdir())

    # tampered stored object → the agent never gets a verified copy, no load, audit event
    bad = put_version(artifacts, tmp_path, "agentbad", seed=81)
    weights = Path(bad.storage_uri.removeprefix("file://")) / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"XXXX")
    router.update_snapshot(snapshot_of(v, bad, revision=2))
    with pytest.raises(AdapterLoadFailed):
        await router.forward(chat(bad))
    assert not (root / bad.lora_name).exists()
    assert bad.lora_name not in sims[0].loaded()
    assert [e["subject_id"] for e in audit.events if e["action"] == "adapter.hash_mismatch"] == ["agentbad"]

    # unloading cleans the staged copy on the agent
    await router.unloader.unload(router.store.replicas[sims[0].url], v.lora_name, "evict")
    assert not staged.exists()


async def test_agent_guards(agent_server: tuple[str, Path, int]) -> None:
    url, root, _ = agent_server
    good = b"hello"
    sha = hashlib.sha256(good).hexdigest()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    name = "a@v1-0123abcd"
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        r = await c.put(
            f"/v1/staging/{name}/files/x.json", params={"sha256": sha, "upload": "ab" * 8}, content=good
        )
        assert r.status_code == 401
        for bad_name in ("..", "a", "a@v1-0123abcd/../../etc"):
            r = await c.put(
                f"/v1/staging/{bad_name}/files/x.json",
                params={"sha256": sha, "upload": "ab" * 8},
                content=good,
                headers=auth,
            )
            assert r.status_code in (400, 404), bad_name
        r = await c.put(
            f"/v1/staging/{name}/files/.hidden",
            params={"sha256": sha, "upload": "ab" * 8},
            content=good,
            headers=auth,
        )
        assert r.status_code == 400
        r = await c.put(
            f"/v1/staging/{name}/files/x.json",
            params={"sha256": "0" * 64, "upload": "ab" * 8},
            content=good,
            headers=auth,
        )
        assert r.status_code == 422 and r.json()["actual"] == sha
        r = await c.put(
            f"/v1/staging/{name}/files/x.json",
            params={"sha256": sha, "upload": "ab" * 8},
            content=good,
            headers=auth,
        )
        assert r.status_code == 200
        manifest = {"files": [{"name": "x.json", "sha256": sha}]}
        r = await c.post(
            f"/v1/staging/{name}/commit", params={"upload": "ab" * 8}, json=manifest, headers=auth
        )
        assert r.status_code == 200 and r.json()["path"] == str(root.resolve() / name)
        r = await c.post(f"/v1/staging/{name}/verify", json=manifest, headers=auth)
        assert r.status_code == 200
        (root / name / "x.json").write_bytes(b"changed")
        r = await c.post(f"/v1/staging/{name}/verify", json=manifest, headers=auth)
        assert r.status_code == 409 and not (root / name).exists()
    outside = [p for p in root.parent.iterdir() if p.name not in ("replica-volume",)]
    assert all("x.json" not in str(p) for p in outside)
