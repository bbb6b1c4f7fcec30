"""Load faults against real simulators (SPEC §8, §18; issue 13 finding 1, under traffic):

- a replica that serves the adapters it holds but refuses every load: after a few failed loads
  of different adapters no new adapter is placed there (each fresh one would cost a failed load
  and a retry), while its own adapters keep being served there — the requests it serves between
  the failures do not hide them;
- once its loads are no longer paused (``outlier_cooloff_s``) and it works again, it takes loads;
- a staging directory that cannot be written (its filesystem full): a :class:`StagingError` —
  the load fails with the designed 503 — and nothing half-written is left, instead of an
  ``OSError`` that reached the client as a 500. The write failure here is a real one: the
  process's file size limit (``RLIMIT_FSIZE``; EFBIG, like ENOSPC an ``OSError`` from
  ``write``); the fault suite fills a real tmpfs (``tests/faults/test_fault_loads.py``).
"""

from __future__ import annotations

import asyncio
import resource
import shutil
from pathlib import Path
from typing import Any

import pytest

from router.staging import LocalStager, StagingError
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of

pytestmark = pytest.mark.xdist_group("router-sims")


def load_calls(sim: Sim) -> int:
    return int(sim.state()["load_calls"])


async def test_replica_refusing_loads_under_traffic_gets_no_new_adapters_and_keeps_serving(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    warm = put_version(artifacts, tmp_path, "warm", seed=700)
    fresh = [put_version(artifacts, tmp_path, f"new{i}", seed=710 + i) for i in range(10)]
    router = await make_router(
        [s.url for s in sims], max_adapters=8, outlier_failures=3, outlier_cooloff_s=60
    )
    router.update_snapshot(snapshot_of(warm, *fresh))
    holder = (await router.forward(chat(warm))).replica
    bad = next(s for s in sims if s.url == holder)
    bad.faults(fail_loads=1000, fail_load_status=500)
    before = load_calls(bad)
    for i, v in enumerate(fresh):
        served = await router.forward(chat(warm, request_id=f"w{i}"))
        assert served.status == 200 and served.replica == bad.url  # it keeps serving what it holds
        res = await router.forward(chat(v, request_id=f"f{i}"))
        assert res.status == 200 and res.replica != bad.url  # loaded elsewhere (retried once)
    # three refused loads of different adapters, then no new adapter was placed there
    assert load_calls(bad) - before == 3
    assert router.store.replicas[bad.url].healthy
    assert (await router.forward(chat(warm, request_id="w-last"))).replica == bad.url


async def test_replica_takes_loads_again_after_its_pause(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    warm = put_version(artifacts, tmp_path, "warm2", seed=730)
    fresh = [put_version(artifacts, tmp_path, f"again{i}", seed=740 + i) for i in range(5)]
    router = await make_router(
        [s.url for s in sims], max_adapters=8, outlier_failures=2, outlier_cooloff_s=1.0
    )
    router.update_snapshot(snapshot_of(warm, *fresh))
    holder = (await router.forward(chat(warm))).replica
    bad = next(s for s in sims if s.url == holder)
    bad.faults(fail_loads=1000, fail_load_status=500)
    ok0 = bad.state()["loads_ok"]
    for i, v in enumerate(fresh[:3]):
        await router.forward(chat(warm, request_id=f"w{i}"))
        assert (await router.forward(chat(v, request_id=f"f{i}"))).status == 200
    assert bad.state()["loads_ok"] == ok0
    bad.faults(reset=True)
    await asyncio.sleep(1.2)  # the pause is over
    placed = [(await router.forward(chat(v, request_id=f"g{i}"))).replica for i, v in enumerate(fresh[3:])]
    assert bad.url in placed, placed


async def test_staging_write_failure_is_a_staging_error_and_leaves_nothing(artifacts, tmp_path: Path) -> None:
    v = put_version(artifacts, tmp_path, "nospace", seed=760)
    root = tmp_path / "staging"
    stager = LocalStager(root, artifacts)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))  # no file of this process past 64 bytes
    try:
        with pytest.raises(StagingError, match="cannot write to the staging directory") as failed:
            await stager.stage("http://replica", "replica", v)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert isinstance(failed.value.__cause__, OSError)
    assert list(root.iterdir()) == []  # no temporary directory, no staged copy
    path = Path(await stager.stage("http://replica", "replica", v))  # room again: it stages
    assert path == root / v.lora_name and sorted(p.name for p in path.iterdir()) == [f.name for f in v.files]


async def test_a_staged_copy_that_vanishes_before_the_load_is_staged_again(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another gateway process may clean the shared staging directory between this process's
    staging and its load (the soak's one `not_found`): the loader stages again and loads."""
    v = put_version(artifacts, tmp_path, "vanishing", seed=43)
    real_stage = LocalStager.stage
    staged: list[str] = []

    async def stage(self: LocalStager, replica_url: str, host: str, version: Any) -> str:
        path = await real_stage(self, replica_url, host, version)
        staged.append(path)
        if len(staged) == 1:
            shutil.rmtree(path)  # the other process's cleanup, in that moment
        return path

    monkeypatch.setattr(LocalStager, "stage", stage)
    router = await make_router([sims[0].url])
    router.update_snapshot(snapshot_of(v))
    res = await router.forward(chat(v))
    assert res.status == 200
    assert len(staged) == 2 and v.lora_name in sims[0].loaded()
