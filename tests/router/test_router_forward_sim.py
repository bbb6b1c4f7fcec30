"""Forwarding against real simulator processes: cold load, rewrite, usage, streaming, base model,
mid-stream death, client disconnect."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from registry.audit_sink import MemoryAuditSink
from router.contract import ForwardResult
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of

pytestmark = pytest.mark.xdist_group("router-sims")


async def drain(result: ForwardResult) -> list[bytes]:
    assert result.stream is not None
    chunks = [c async for c in result.stream]
    return b"".join(chunks).split(b"\n\n")


async def test_cold_load_then_hit_rewrites_model_and_reports_usage(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "acme", seed=1)
    router = await make_router([sims[0].url])
    router.update_snapshot(snapshot_of(v))
    assert router.ready() and router.healthy_count("demo-base") == 1

    res = await router.forward(chat(v))
    assert res.status == 200 and res.cold_load and res.replica == sims[0].url
    assert res.body is not None
    body = orjson.loads(res.body)
    assert body["model"] == "demo-base:acme"
    assert v.lora_name.encode() not in res.body
    assert res.usage is not None and res.usage.completion_tokens > 0
    assert res.usage.total_tokens == res.usage.prompt_tokens + res.usage.completion_tokens

    # The replica was given a path inside the staging directory, and the files there verify.
    state = sims[0].state()
    paths = {a["name"]: a["path"] for a in state["adapters"]}
    staged = Path(paths[v.lora_name])
    assert staged.resolve().parent == (tmp_path / "staging").resolve()
    assert {p.name for p in staged.iterdir()} == {f.name for f in v.files}

    res2 = await router.forward(chat(v))
    assert not res2.cold_load
    assert sims[0].state()["load_calls"] == state["load_calls"]  # no second load
    loaded = [e for e in audit.events if e["action"] == "adapter.loaded"]
    assert len(loaded) == 1
    ev = loaded[0]
    assert ev["subject_type"] == "adapter" and ev["subject_id"] == "acme"
    assert ev["details"]["version"] == "v1" and ev["details"]["replica"] == sims[0].url
    assert ev["details"]["duration_ms"] >= 0
    recs = router.replica_records()
    assert recs[0]["adapters"] == [
        {"adapter": "acme", "version": "v1", "lora_name": v.lora_name, "state": "resident"}
    ]


async def test_streaming_rewrites_every_event_and_strips_unasked_usage(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "streamy", seed=2)
    router = await make_router([sims[0].url])
    router.update_snapshot(snapshot_of(v))

    res = await router.forward(chat(v, stream=True, max_tokens=5))
    events = [e for e in await drain(res) if e]
    assert events[-1] == b"data: [DONE]"
    datas = [orjson.loads(e[6:]) for e in events[:-1]]
    assert all(d["model"] == "demo-base:streamy" for d in datas)
    assert not any(d.get("choices") == [] for d in datas), "usage chunk must be stripped"
    assert res.usage is not None and res.usage.completion_tokens == 5

    res2 = await router.forward(chat(v, stream=True, max_tokens=3, client_wants_usage=True))
    events2 = [e for e in await drain(res2) if e]
    usage_chunks = [orjson.loads(e[6:]) for e in events2[:-1] if b'"choices":[]' in e]
    assert len(usage_chunks) == 1 and usage_chunks[0]["usage"]["completion_tokens"] == 3
    assert usage_chunks[0]["model"] == "demo-base:streamy"


async def test_base_model_request(sims: list[Sim], make_router: RouterFactory) -> None:
    router = await make_router([sims[0].url, sims[1].url])
    res = await router.forward(chat(None))
    assert res.status == 200 and res.body is not None and not res.cold_load
    assert orjson.loads(res.body)["model"] == "demo-base"


async def test_a_base_model_no_replica_serves_is_no_capacity_with_retry_after(
    sims: list[Sim], make_router: RouterFactory
) -> None:
    from dataclasses import replace

    from router.contract import NoCapacity

    router = await make_router([sims[0].url])
    with pytest.raises(NoCapacity, match="no replicas serve base model other-base") as caught:
        await router.forward(replace(chat(None), base_model="other-base", client_model="other-base"))
    assert caught.value.retry_after == 5


async def test_mid_stream_death_ends_with_error_event(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "dies", seed=3)
    router = await make_router([sims[0].url])
    router.update_snapshot(snapshot_of(v))
    await router.forward(chat(v))  # load it first
    sims[0].faults(die_after_tokens=2, die_streams=1)
    res = await router.forward(chat(v, stream=True, max_tokens=20))
    events = [e for e in await drain(res) if e]
    assert events[-1] == b"data: [DONE]"
    err = orjson.loads(events[-2][6:])
    assert "error" in err and err["error"]["type"] == "server_error"
    content = [e for e in events[:-2] if b'"content"' in e]
    assert 1 <= len(content) < 20  # some tokens came, then the error: not a silent truncation
    assert router.store.replicas[sims[0].url].inflight == 0


async def test_concurrent_requests_one_process_one_load(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "crowd", seed=5)
    router = await make_router([sims[0].url])
    router.update_snapshot(snapshot_of(v))
    before = sims[0].state()["load_calls"]
    results = await asyncio.gather(*(router.forward(chat(v, request_id=f"r{i}")) for i in range(20)))
    assert all(r.status == 200 for r in results)
    assert sims[0].state()["load_calls"] - before == 1
