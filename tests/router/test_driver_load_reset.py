"""A connection reset during a load (issue 24.8): ``other`` while the replica answers its health
check, ``replica_down`` only when it does not (or refuses connections) — a reset must not eject a
healthy replica and cancel every request there still waiting for its first byte."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kit.localservices import free_port
from router.contract import AdapterLoadFailed
from router.drivers import VllmDriver
from tests.router.conftest import RouterFactory
from tests.router.routerkit import chat, put_version, snapshot_of


class ResettingReplica:
    """vLLM's API, but every load call's connection is reset (RST) before an answer."""

    def __init__(self) -> None:
        self.healthy = True
        self.load_calls = 0

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "demo-base", "parent": None}]})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def load(self, request: web.Request) -> web.Response:
        self.load_calls += 1
        await request.read()
        transport = request.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()  # SO_LINGER 0: the close is a reset
        return web.Response(status=200)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.sleep(1.0)  # a slow first byte: the request waits on this replica meanwhile
        return web.json_response(
            {"id": "c1", "object": "chat.completion", "model": body["model"], "choices": []}
        )


@pytest.fixture
async def resetting() -> AsyncIterator[tuple[ResettingReplica, str]]:
    fake = ResettingReplica()
    app = web.Application()
    app.router.add_get("/health", fake.health)
    app.router.add_get("/v1/models", fake.models)
    app.router.add_get("/metrics", fake.metrics)
    app.router.add_post("/v1/load_lora_adapter", fake.load)
    app.router.add_post("/v1/chat/completions", fake.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_reset_during_load_is_other_while_the_replica_is_healthy(
    resetting: tuple[ResettingReplica, str],
) -> None:
    fake, url = resetting
    async with aiohttp.ClientSession() as session:
        res = await VllmDriver(session).load(url, "a@v1-00000000", "/tmp/x", 5.0)
        assert fake.load_calls == 1
        assert (res.ok, res.failure) == (False, "other")
        assert res.retry_elsewhere


async def test_reset_during_load_is_replica_down_when_its_health_check_fails(
    resetting: tuple[ResettingReplica, str],
) -> None:
    fake, url = resetting
    fake.healthy = False
    async with aiohttp.ClientSession() as session:
        res = await VllmDriver(session).load(url, "a@v1-00000000", "/tmp/x", 5.0)
        assert (res.ok, res.failure) == (False, "replica_down")


async def test_refused_load_is_replica_down() -> None:
    async with aiohttp.ClientSession() as session:
        res = await VllmDriver(session).load(f"http://127.0.0.1:{free_port()}", "a@v1-0", "/tmp/x", 5.0)
        assert (res.ok, res.failure) == (False, "replica_down")


async def test_reset_load_keeps_the_replica_and_its_waiting_requests(
    resetting: tuple[ResettingReplica, str], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    fake, url = resetting
    v = put_version(artifacts, tmp_path, "resetme", seed=7)
    router = await make_router([url])
    router.update_snapshot(snapshot_of(v))
    waiting = asyncio.create_task(router.forward(chat(None)))  # waits ~1 s for its first byte
    await asyncio.sleep(0.2)
    with pytest.raises(AdapterLoadFailed):
        await router.forward(chat(v))  # the load's connection is reset (and retried: same replica)
    assert fake.load_calls >= 1
    rep = router.store.replicas[url]
    assert rep.healthy, "a reset during a load must not take a healthy replica out of rotation"
    res = await asyncio.wait_for(waiting, 10)  # not cancelled by an ejection
    assert res.status == 200
