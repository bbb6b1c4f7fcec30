"""Router against a tiny fake upstream (aiohttp): a replica answering with the wrong adapter,
and a replica whose stream ends without [DONE]."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from kit.localservices import free_port
from registry.audit_sink import MemoryAuditSink
from router.contract import UpstreamError
from tests.router.conftest import RouterFactory
from tests.router.routerkit import chat, put_version, snapshot_of


class FakeReplica:
    """Speaks just enough of vLLM's API; answers with ``answer_model`` instead of the asked one."""

    def __init__(self) -> None:
        self.answer_model = "someone-else@v9-deadbeef"
        self.adapters: dict[str, str] = {}
        self.truncate = False

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": "demo-base", "object": "model", "parent": None, "root": "demo-base"}]
        data += [
            {"id": n, "object": "model", "parent": "demo-base", "root": p} for n, p in self.adapters.items()
        ]
        return web.json_response({"object": "list", "data": data})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text='vllm:num_requests_running{engine="0",model_name="demo-base"} 0.0\n')

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.adapters[body["lora_name"]] = body["lora_path"]
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(
                {"id": "x", "object": "chat.completion", "model": self.answer_model, "choices": []}
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        ev = {"id": "x", "object": "chat.completion.chunk", "model": body["model"], "choices": [{"index": 0}]}
        await resp.write(b"data: " + orjson.dumps(ev) + b"\n\n")
        if not self.truncate:
            ev["model"] = self.answer_model
            await resp.write(b"data: " + orjson.dumps(ev) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeReplica, str]]:
    f = FakeReplica()
    app = web.Application()
    app.router.add_get("/health", f.health)
    app.router.add_get("/v1/models", f.models)
    app.router.add_get("/metrics", f.metrics)
    app.router.add_post("/v1/load_lora_adapter", f.load)
    app.router.add_post("/v1/chat/completions", f.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_wrong_adapter_answer_is_an_error_and_audited(
    fake: tuple[FakeReplica, str],
    make_router: RouterFactory,
    artifacts,
    audit: MemoryAuditSink,
    tmp_path: Path,
) -> None:
    replica, url = fake
    v = put_version(artifacts, tmp_path, "rightone", seed=90)
    router = await make_router([url])
    router.update_snapshot(snapshot_of(v))
    with pytest.raises(UpstreamError):
        await router.forward(chat(v))
    ev = [e for e in audit.events if e["action"] == "adapter.wrong_adapter"]
    assert len(ev) == 1
    assert ev[0]["subject_id"] == "rightone"
    assert ev[0]["details"]["asked"] == v.lora_name
    assert ev[0]["details"]["answered"] == "someone-else@v9-deadbeef"
    # the lora_path sent to the replica lies inside the staging directory
    assert Path(replica.adapters[v.lora_name]).parent == (tmp_path / "staging").resolve()

    # streaming: the first event is right, the second comes from another adapter → error event
    res = await router.forward(chat(v, stream=True))
    assert res.stream is not None
    out = b"".join([c async for c in res.stream])
    events = [e for e in out.split(b"\n\n") if e]
    assert orjson.loads(events[0][6:])["model"] == "demo-base:rightone"
    assert b"someone-else" not in out
    assert orjson.loads(events[-2][6:])["error"]["code"] == "wrong_adapter"
    assert events[-1] == b"data: [DONE]"
    assert len([e for e in audit.events if e["action"] == "adapter.wrong_adapter"]) == 2
    assert router.store.replicas[url].inflight == 0


async def test_stream_without_done_is_not_silently_truncated(
    fake: tuple[FakeReplica, str], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    replica, url = fake
    replica.truncate = True
    v = put_version(artifacts, tmp_path, "cutshort", seed=91)
    router = await make_router([url])
    router.update_snapshot(snapshot_of(v))
    res = await router.forward(chat(v, stream=True))
    assert res.stream is not None
    events = [e for e in b"".join([c async for c in res.stream]).split(b"\n\n") if e]
    assert b"error" in events[-2] and events[-1] == b"data: [DONE]"
