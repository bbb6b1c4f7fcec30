"""Replica down and back (kill / restart a real simulator), and client disconnect cancelling
upstream work on a simulator with real generation timing."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import cast

import pytest

from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of, wait_until

pytestmark = pytest.mark.xdist_group("router-sims")


async def test_replica_down_and_back(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "survivor", seed=100)
    router = await make_router([sims[0].url, sims[1].url])
    router.update_snapshot(snapshot_of(v))
    assert router.healthy_count() == 2
    sims[1].kill()
    # requests keep working while the dead replica is detected (failover before the first byte)
    for i in range(4):
        res = await router.forward(chat(v, request_id=f"k{i}"))
        assert res.status == 200 and res.replica == sims[0].url
    await wait_until(lambda: router.healthy_count() == 1, timeout=10)
    rec = {r["url"]: r for r in router.replica_records()}
    assert rec[sims[1].url]["healthy"] is False
    sims[1].start()
    await wait_until(lambda: router.healthy_count() == 2, timeout=20)
    assert router.ready()


@pytest.fixture(scope="module")
def timed_sim() -> Iterator[Sim]:
    sim = Sim(["--decode-base-s", "0.05", "--enable-fault-control", "--log-level", "error"]).start()
    try:
        yield sim
    finally:
        sim.stop()


async def test_client_disconnect_cancels_upstream(
    timed_sim: Sim, make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "slowpoke", seed=101)
    router = await make_router([timed_sim.url])
    router.update_snapshot(snapshot_of(v))
    res = await router.forward(chat(v, stream=True, max_tokens=400))
    assert res.stream is not None
    first = await res.stream.__anext__()
    assert first.startswith(b"data: ")
    assert timed_sim.state()["in_flight"] == 1
    stream = cast(AsyncGenerator[bytes, None], res.stream)
    await stream.aclose()  # the client went away
    await wait_until(lambda: timed_sim.state()["in_flight"] == 0, timeout=5)
    rep = router.store.replicas[timed_sim.url]
    assert rep.inflight == 0 and rep.residents[v.lora_name].inflight == 0
