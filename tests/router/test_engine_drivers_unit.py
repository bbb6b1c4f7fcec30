"""Engine drivers and capabilities without replicas: what each driver makes of its engine's
answers (classification), how it names an adapter in a request, and the pool settings an
engine's load mode needs."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest
from pydantic import ValidationError

from router.capabilities import CAPABILITIES, capabilities_of
from router.drivers import RayServeDriver, SglangDriver, TrtllmDriver, VllmDriver, make_driver
from router.drivers.sglang import classify_load
from router.settings import UNBOUNDED, PoolConfig


def test_capabilities_are_data_per_engine() -> None:
    assert set(CAPABILITIES) == {"vllm", "sglang", "ray-serve", "trtllm"}
    assert capabilities_of("vllm").lists_adapters and not capabilities_of("vllm").implicit_reload
    sg = capabilities_of("sglang")
    assert (sg.load_mode, sg.residency, sg.implicit_reload, sg.pinning) == ("explicit", "exact", True, True)
    ray = capabilities_of("ray-serve")
    assert (ray.load_mode, ray.residency, ray.plane_evicts) == ("lazy_by_name", "advisory", False)
    trt = capabilities_of("trtllm")
    assert (trt.load_mode, trt.needs_int_id, trt.lists_adapters) == ("per_request", True, False)
    with pytest.raises(ValueError, match="unknown engine"):
        capabilities_of("tgi")


def test_pool_settings_an_engine_needs() -> None:
    with pytest.raises(ValidationError, match="loads adapters by name"):
        PoolConfig(engine="ray-serve")
    with pytest.raises(ValidationError, match="publish is for engines that load adapters by name"):
        PoolConfig(engine="sglang", staging={"mode": "publish", "uri": "s3://b/p/"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="needs uri"):
        PoolConfig(engine="ray-serve", staging={"mode": "publish", "uri": "http://x/"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"set staging\.dir"):
        PoolConfig(engine="trtllm", staging={"mode": "agent"})  # type: ignore[arg-type]
    ray = PoolConfig(engine="ray-serve", staging={"mode": "publish", "uri": "s3://b/loras/"})  # type: ignore[arg-type]
    assert ray.evict_bound == UNBOUNDED  # Ray's own LRU bounds its replicas; the plane never evicts
    assert PoolConfig(engine="sglang", max_adapters=5).evict_bound == 5


def _body(**kw: object) -> bytes:
    return orjson.dumps(kw)


def test_sglang_load_classification() -> None:
    ok = classify_load(200, _body(success=True, error_message="", loaded_adapters={"a": "/p"}), "a")
    assert ok.ok
    dup = classify_load(
        400,
        _body(success=False, error_message="Failed to load LoRA adapter a because it is already loaded",
              loaded_adapters={"a": "/p"}),
        "a",
    )  # fmt: skip
    assert dup.failure == "conflict"  # the replica lists it: loaded
    bad = classify_load(400, _body(success=False, error_message="rank too big", loaded_adapters={}), "a")
    assert (bad.failure, bad.message) == ("rejected", "rank too big")
    assert classify_load(503, b"", "a").failure == "replica_down"
    assert classify_load(500, b"oops", "a").failure == "other"


async def test_request_naming_and_answer_classification_per_engine(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as s:
        vllm, sg = VllmDriver(s), SglangDriver(s)
        ray = RayServeDriver(s, served_model="base")
        trt = TrtllmDriver(s, replica_dir=str(tmp_path))
        assert vllm.request_fields("a@v1-00000000", 7, "base") == {"model": "a@v1-00000000"}
        assert sg.request_fields("a@v1-00000000", 7, "base") == {"model": "base:a@v1-00000000"}
        assert ray.request_fields("a@v1-00000000", 7, "base") == {"model": "base:a@v1-00000000"}
        assert trt.request_fields("a@v1-00000000", 7, "base") == {
            "model": "base",
            "lora_request": {
                "lora_name": "a@v1-00000000",
                "lora_int_id": 7,
                "lora_path": f"{tmp_path}/a@v1-00000000",
            },
        }
        assert all(d.request_fields(None, 0, "base") == {"model": "base"} for d in (vllm, sg, ray, trt))

        def err(message: str, nested: bool = True) -> bytes:
            e = {"object": "error", "message": message, "type": "BadRequest", "param": None, "code": 400}
            return orjson.dumps({"error": e} if nested else e)

        never = err("Got LoRA adapter that has never been loaded: a\nAll loaded adapters: dict_keys([]).")
        assert sg.classify_answer(400, never, adapter=True) == "adapter_missing"
        assert sg.classify_answer(400, err("max_tokens too large"), adapter=True) == "ok"
        assert sg.classify_answer(404, err("Model 'x:a' is not served."), adapter=True) == "retry"
        miss = err("LoRA task 7 not found in cache. Please send LoRA weights with request", nested=False)
        assert trt.classify_answer(400, miss, adapter=True) == "adapter_missing"
        assert trt.classify_answer(400, err("bad temperature", nested=False), adapter=True) == "ok"
        assert ray.classify_answer(404, err("Unable to find LoRA adapter config file"), adapter=True) == (
            "adapter_missing"
        )
        assert ray.classify_answer(408, b"", adapter=False) == "retry"
        assert (await trt.load("http://x", "a@v1-0", "/p", 1.0, int_id=0)).failure == "rejected"
        assert (await trt.load("http://x", "a@v1-0", "/p", 1.0, int_id=3)).ok


async def test_make_driver_per_pool(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as s:
        pools = {
            "vllm": PoolConfig(),
            "sglang": PoolConfig(engine="sglang"),
            "ray-serve": PoolConfig(engine="ray-serve", staging={"mode": "publish", "uri": "s3://b/p/"}),  # type: ignore[arg-type]
            "trtllm": PoolConfig(engine="trtllm"),
        }
        for engine, pool in pools.items():
            d = make_driver(pool, s, staging_dir=tmp_path)
            assert d.name == engine and d.capabilities is CAPABILITIES[engine]
        trt = make_driver(pools["trtllm"], s, staging_dir=tmp_path / "st")
        assert isinstance(trt, TrtllmDriver) and trt.lora_path("n") == f"{(tmp_path / 'st').resolve()}/n"
