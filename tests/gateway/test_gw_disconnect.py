"""A client that disconnects, on every path (cold or warm, streamed or not), cancels its upstream
request and frees its concurrency slot at once, logged 499 (SPEC §19 "Disconnects", issue 24.7).

Real sockets against the gateway app served by uvicorn, on the real router and a simulator
replica with real generation timing (a long answer takes seconds): the client closes its TCP
connection mid-request; within a bound the replica has nothing generating any more (it saw the
connection close), the tenant's only slot (``max_concurrency`` 1) is free, and the access log
line says 499 ``client_disconnected``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

import gateway.api
from gateway.ratelimit import AdmissionPlan, AdmitResult, MemoryLimiter, make_plan
from registry.snapshot import Limits
from tests.router.routerkit import Sim, http

from .gw_real import RealGateway, access_lines, real_gateway

pytestmark = pytest.mark.xdist_group("gw-real")

STEP_S = 0.05  # the replica's decode step: 400 tokens take ~20 s
PREFILL_S = 0.002  # per prompt token: a 2,000-token prompt's first token comes after ~4 s
LONG_PROMPT = " ".join(["story"] * 2000)
BOUND_S = 2.0  # from the client's close to: replica idle, slot free


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[Sim]:
    s = Sim(
        ["--decode-base-s", str(STEP_S), "--prefill-s-per-token", str(PREFILL_S), "--enable-fault-control",
         "--log-level", "error"]
    ).start()  # fmt: skip
    try:
        yield s
    finally:
        s.stop()


def _slot_key() -> str:
    plan = make_plan(tenant_id="acme", rpm=None, tpm=None, max_concurrency=1, estimated_tokens=0)
    return plan.slots[0].key


async def _open_request(
    g: RealGateway, *, stream: bool, max_tokens: int, prompt: str = "tell me a long story"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send one chat completion on a raw connection (the client's socket)."""
    host, port = g.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = orjson.dumps(
        {
            "model": "demo-base:dc",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    )
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {g.key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return reader, writer


async def _until(pred: object, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        ok = pred() if callable(pred) else pred
        if ok:
            return time.monotonic() - t0
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout} s")


@pytest.mark.parametrize(
    ("path", "stream"),
    [("warm", False), ("warm", True), ("first-byte", True), ("cold", False), ("cold", True)],
    ids=["warm-whole", "warm-stream", "warm-stream-before-first-byte", "cold-whole", "cold-stream"],
)
async def test_a_client_that_disconnects_cancels_upstream_and_frees_its_slot_at_once(
    slow_sim: Sim,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    stream: bool,
) -> None:
    def no_watcher_task(*args: object) -> None:
        raise AssertionError("uvicorn with our protocol calls the scope's hook: no watcher task")

    monkeypatch.setattr(gateway.api, "_cancel_on_disconnect", no_watcher_task)
    slow_sim.faults(reset=True)
    for name in slow_sim.loaded():  # nothing resident from an earlier test
        http().post(f"{slow_sim.url}/v1/unload_lora_adapter", json={"lora_name": name})
    limiter = MemoryLimiter()
    async with real_gateway(
        tmp_path, [slow_sim.url], ["dc"], serve=True, limits=Limits(max_concurrency=1), limiter=limiter
    ) as g:
        if path != "cold":  # resident first: the request goes straight to generation
            async with g.client(timeout=30) as c:
                r = await c.post("/v1/chat/completions", json={"model": "demo-base:dc", "messages": [
                    {"role": "user", "content": "hi"}], "max_tokens": 1})  # fmt: skip
                assert r.status_code == 200, r.text
        else:  # the load takes 3 s: the client leaves while it waits for it
            slow_sim.faults(slow_load_s=3.0)
        caplog.set_level(logging.INFO, logger="loraplane.gateway.access")
        caplog.clear()
        prompt = LONG_PROMPT if path == "first-byte" else "tell me a long story"
        _reader, writer = await _open_request(g, stream=stream, max_tokens=400, prompt=prompt)
        if path != "cold":
            await _until(lambda: slow_sim.state()["in_flight"] == 1, 10, "the replica generating")
            # well into the answer (a stream has sent its first chunks), or into the prompt's prefill
            await asyncio.sleep(0.3)
            assert g.gw.cold.waiting == {}
        else:
            await _until(lambda: g.gw.cold.waiting == {"dc": 1}, 10, "the request waiting for the load")
        assert limiter.in_use(_slot_key()) == 1
        t0 = time.monotonic()
        writer.close()  # the client goes away
        await _until(lambda: limiter.in_use(_slot_key()) == 0, BOUND_S, "the slot freed")
        await _until(lambda: slow_sim.state()["in_flight"] == 0, BOUND_S, "the replica idle")
        took = time.monotonic() - t0
        assert access_lines(caplog.records) == [(499, "client_disconnected")]
        assert g.gw.cold.waiting == {} and g.gw.active == 0
        rep = g.router.store.replicas[slow_sim.url]
        assert rep.inflight == 0
        print(f"{path} stream={stream}: slot free, replica idle {took:.2f}s after the close")
        # the tenant's one slot serves the next request at once
        slow_sim.faults(slow_load_s=0)
        async with g.client(timeout=30) as c:
            r = await c.post("/v1/chat/completions", json={"model": "demo-base:dc", "messages": [
                {"role": "user", "content": "hi"}], "max_tokens": 2})  # fmt: skip
            assert r.status_code == 200, r.text


class HeldLimiter(MemoryLimiter):
    """Admission waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.go = asyncio.Event()

    async def admit(self, plan: AdmissionPlan) -> AdmitResult:
        self.entered.set()
        await self.go.wait()
        return await super().admit(plan)


async def test_a_client_gone_while_being_admitted_is_not_forwarded(
    slow_sim: Sim, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    slow_sim.faults(reset=True)
    limiter = HeldLimiter()
    async with real_gateway(
        tmp_path, [slow_sim.url], ["dc"], serve=True, limits=Limits(max_concurrency=1), limiter=limiter
    ) as g:
        limiter.go.set()
        async with g.client(timeout=30) as c:  # resident first (and the admission path works)
            r = await c.post("/v1/chat/completions", json={"model": "demo-base:dc", "messages": [
                {"role": "user", "content": "hi"}], "max_tokens": 1})  # fmt: skip
            assert r.status_code == 200, r.text
        limiter.go.clear()
        limiter.entered.clear()
        caplog.set_level(logging.INFO, logger="loraplane.gateway.access")
        caplog.clear()
        calls = slow_sim.state()["requests_done"]
        _reader, writer = await _open_request(g, stream=False, max_tokens=400)
        await asyncio.wait_for(limiter.entered.wait(), 10)
        writer.close()
        await asyncio.sleep(0.3)  # the server has seen the connection drop
        limiter.go.set()
        await _until(lambda: access_lines(caplog.records) != [], BOUND_S, "the request's log line")
        assert access_lines(caplog.records) == [(499, "client_disconnected")]
        assert limiter.in_use(_slot_key()) == 0 and g.gw.active == 0
        assert g.router.store.replicas[slow_sim.url].inflight == 0
        assert slow_sim.state()["requests_done"] == calls  # nothing reached the replica
