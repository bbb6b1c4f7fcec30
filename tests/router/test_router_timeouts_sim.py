"""Timeouts towards replicas (SPEC §18, fault-run finding 2) on real simulators: a long healthy
stream is never cut by the request timeout; a silent stream ends with an error event; a hung
replica (SIGSTOP) costs a first-byte timeout or its ejection, then the request is retried on
another replica."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.contract import ForwardResult, UpstreamTimeout
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of

pytestmark = pytest.mark.xdist_group("router-sims")


async def drain(res: ForwardResult) -> bytes:
    assert res.stream is not None
    return b"".join([chunk async for chunk in res.stream])


@pytest.fixture
def stopped(sims: list[Sim]) -> Iterator[list[Sim]]:
    """Simulators that a test may SIGSTOP; continued again whatever happens."""
    yield sims
    for s in sims:
        if s.pid is not None:
            os.kill(s.pid, signal.SIGCONT)


async def test_long_healthy_stream_outlives_the_request_timeout(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "longstream", seed=400)
    router = await make_router([sims[0].url], request_timeout_s=1.0, upstream_idle_timeout_s=5.0)
    router.update_snapshot(snapshot_of(v))
    sims[0].faults(stall_s=1.5, stall_after_tokens=1)
    t0 = time.monotonic()
    res = await router.forward(chat(v, stream=True, max_tokens=8))
    body = await drain(res)
    assert time.monotonic() - t0 > 1.4  # longer than request_timeout_s
    assert body.rstrip().endswith(b"data: [DONE]") and b'"error"' not in body
    assert res.stream_error is None


async def test_silent_stream_ends_with_an_error_event_and_says_so(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "silent", seed=401)
    router = await make_router([sims[0].url], upstream_idle_timeout_s=0.5)
    router.update_snapshot(snapshot_of(v))
    sims[0].faults(stall_s=5.0, stall_after_tokens=2)
    t0 = time.monotonic()
    res = await router.forward(chat(v, stream=True, max_tokens=8))
    body = await drain(res)
    assert time.monotonic() - t0 < 4.0
    assert b'"code":"upstream_timeout"' in body and body.rstrip().endswith(b"data: [DONE]")
    assert res.stream_error == "upstream_timeout"


async def test_hung_replica_costs_a_first_byte_timeout_then_another_replica_answers(
    stopped: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    sims = stopped
    v = put_version(artifacts, tmp_path, "hungstream", seed=402)
    warm = await make_router([sims[0].url])
    warm.update_snapshot(snapshot_of(v))
    await warm.forward(chat(v))  # resident on sims[0] only: placement's first choice
    router = await make_router(
        [sims[0].url, sims[1].url], upstream_ttfb_timeout_s=1.0, poll_timeout_s=30.0, outlier_failures=5
    )
    router.update_snapshot(snapshot_of(v))
    assert sims[0].pid is not None
    os.kill(sims[0].pid, signal.SIGSTOP)
    t0 = time.monotonic()
    res = await router.forward(chat(v, stream=True, max_tokens=4))
    body = await drain(res)
    assert res.replica == sims[1].url and body.rstrip().endswith(b"data: [DONE]")
    assert 0.9 < time.monotonic() - t0 < 6.0


async def test_first_byte_timeout_on_every_replica_tried_is_a_504_upstream_timeout(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "ttfb504", seed=404)
    router = await make_router([sims[0].url], upstream_ttfb_timeout_s=0.5)
    router.update_snapshot(snapshot_of(v))
    base = chat(v, stream=True, max_tokens=4)  # a completion: no role event before the first token
    req = dataclasses.replace(
        base,
        endpoint="completions",
        body={"model": base.client_model, "prompt": "hello", "max_tokens": 4, "stream": True},
    )
    sims[0].faults(stall_s=5.0, stall_after_tokens=0)
    t0 = time.monotonic()
    with pytest.raises(UpstreamTimeout) as err:
        await router.forward(req)
    took = time.monotonic() - t0
    assert err.value.status == 504 and err.value.code == "upstream_timeout"
    assert 0.9 < took < 4.0, took  # the first try and the retry, 0.5 s each; not the 5 s stall


async def test_requests_waiting_on_a_hung_replica_move_when_it_leaves_rotation(
    stopped: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    sims = stopped
    v = put_version(artifacts, tmp_path, "hungplain", seed=403)
    warm = await make_router([sims[0].url])
    warm.update_snapshot(snapshot_of(v))
    await warm.forward(chat(v))
    router = await make_router(
        [sims[0].url, sims[1].url], poll_interval_s=0.2, poll_timeout_s=0.5, request_timeout_s=60.0
    )
    router.update_snapshot(snapshot_of(v))
    assert sims[0].pid is not None
    os.kill(sims[0].pid, signal.SIGSTOP)
    t0 = time.monotonic()
    results = await asyncio.gather(*(router.forward(chat(v, request_id=f"h{i}")) for i in range(4)))
    took = time.monotonic() - t0
    assert [r.status for r in results] == [200] * 4
    assert {r.replica for r in results} == {sims[1].url}
    assert took < 10.0, took  # two failed polls (0.5 s each), not the 60 s request timeout
    assert not router.store.replicas[sims[0].url].healthy
