"""A load that times out on the router's side but completes on the replica (issue 24.9).

The router gives up on a load call after ``load_timeout_s``; the replica (a real simulator whose
loads take longer) finishes it anyway. That adapter must stay counted toward the replica's
``max_adapters`` from the timeout on — the simulator's own ``/v1/models`` listing, read every
20 ms by a thread while further cold loads run, never shows more than ``max_adapters`` — and
once the replica lists it the router knows it as resident.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from router.contract import AdapterLoadFailed, NoCapacity
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of, wait_until

pytestmark = pytest.mark.xdist_group("router-sims")

MAX_ADAPTERS = 2
SLOW_LOAD_S = 1.5
LOAD_TIMEOUT_S = 0.5


class ListingWatch:
    """Reads a replica's ``/v1/models`` every 20 ms in a thread; keeps the largest adapter count."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.most = 0
        self.seen: list[set[str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                data = client.get(f"{self.url}/v1/models").json()["data"]
                names = {m["id"] for m in data if m.get("parent")}
                if len(names) > self.most:
                    self.most = len(names)
                    self.seen.append(names)
                time.sleep(0.02)

    def __enter__(self) -> ListingWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


async def test_a_timed_out_load_that_completes_on_the_replica_stays_counted(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    sim = sims[0]
    slow = put_version(artifacts, tmp_path, "slowpoke", seed=900)
    fresh = [put_version(artifacts, tmp_path, f"after{i}", seed=910 + i) for i in range(4)]
    router = await make_router(
        [sim.url],
        max_adapters=MAX_ADAPTERS,
        load_timeout_s=LOAD_TIMEOUT_S,
        max_loads_per_replica=0,  # loads may overlap: only the occupancy count keeps the bound
        poll_interval_s=5.0,  # no poll-and-trim hides an overflow between two samples
        reconcile_interval_s=5.0,
    )
    router.update_snapshot(snapshot_of(slow, *fresh))
    with ListingWatch(sim.url) as watch:
        sim.faults(slow_load_s=SLOW_LOAD_S)
        t0 = time.monotonic()
        with pytest.raises((AdapterLoadFailed, NoCapacity)):
            await router.forward(chat(slow, request_id="slow"))
        assert time.monotonic() - t0 < SLOW_LOAD_S  # the router gave up before the replica finished
        sim.faults(slow_load_s=0)  # further loads are quick; the slow one still runs there
        for i, v in enumerate(fresh):
            res = await router.forward(chat(v, request_id=f"cold{i}"))
            assert res.status == 200 and res.replica == sim.url
        # the replica finishes the slow load; the router learns it without a poll
        await wait_until(lambda: slow.lora_name in sim.loaded(), timeout=10)
        await wait_until(
            lambda: (
                (r := router.store.replicas[sim.url].residents.get(slow.lora_name)) is not None
                and r.state == "resident"
            ),
            timeout=5,
        )
        res = await router.forward(chat(fresh[0], request_id="cold-again"))  # one more cold load
        assert res.status == 200
        await asyncio.sleep(0.2)
    assert watch.most <= MAX_ADAPTERS, watch.seen
    assert len(sim.loaded()) <= MAX_ADAPTERS
