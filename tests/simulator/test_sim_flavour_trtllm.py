"""The TensorRT-LLM flavour: the adapter travels in every request (``lora_request``), weights are
cached by ``lora_int_id`` (an id reused for other files serves the cached weights), a cache that
drops an id between the check and the enqueue answers the PEFT cache-miss error, and a resend
succeeds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.simulator.flavourutil import chat_body, flavour_client

MakeAdapter = Callable[..., str]


def _lora(path: str, lora_id: int, name: str = "a") -> dict[str, Any]:
    return {"lora_request": {"lora_name": name, "lora_int_id": lora_id, "lora_path": path}}


async def test_lora_request_loads_once_per_id(make_adapter: MakeAdapter) -> None:
    path = make_adapter("a")
    async with flavour_client("trtllm") as (c, _):
        for _ in range(2):
            r = await c.post("/v1/chat/completions", json=chat_body("demo-base", **_lora(path, 7)))
            assert r.status_code == 200 and r.json()["model"] == "demo-base"
        state = (await c.get("/_sim/engine")).json()
        assert (state["weight_loads"], state["cached"]) == (1, [7])
        assert [x["id"] for x in (await c.get("/v1/models")).json()["data"]] == ["demo-base"]
        assert isinstance((await c.get("/metrics")).json(), list)


async def test_a_reused_id_serves_the_cached_weights(make_adapter: MakeAdapter) -> None:
    one, two = make_adapter("one", seed=1), make_adapter("two", seed=2)
    async with flavour_client("trtllm") as (c, _):
        first = (await c.post("/v1/chat/completions", json=chat_body("demo-base", **_lora(one, 3)))).json()
        other = (await c.post("/v1/chat/completions", json=chat_body("demo-base", **_lora(two, 4)))).json()
        reused = (await c.post("/v1/chat/completions", json=chat_body("demo-base", **_lora(two, 3)))).json()
        assert reused["choices"][0]["message"] == first["choices"][0]["message"]  # id 3's weights
        assert reused["choices"][0]["message"] != other["choices"][0]["message"]


async def test_cache_miss_is_400_and_a_resend_loads_the_weights_again(make_adapter: MakeAdapter) -> None:
    path = make_adapter("a")
    async with flavour_client("trtllm") as (c, _):
        assert (
            await c.post("/v1/completions", json={"model": "m", "prompt": "x", **_lora(path, 5)})
        ).status_code == 200
        assert (await c.post("/_sim/engine", json={"evict_next": 1})).status_code == 204
        r = await c.post("/v1/completions", json={"model": "m", "prompt": "x", **_lora(path, 5)})
        assert r.status_code == 400
        assert r.json() == {
            "object": "error",
            "message": "LoRA task 5 not found in cache. Please send LoRA weights with request",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
        r = await c.post("/v1/completions", json={"model": "m", "prompt": "x", **_lora(path, 5)})
        assert r.status_code == 200
        state = (await c.get("/_sim/engine")).json()
        assert (state["weight_loads"], state["cache_misses"]) == (2, 1)


async def test_host_cache_lru_drops_ids_and_they_load_again(make_adapter: MakeAdapter) -> None:
    paths = [make_adapter(f"x{i}", seed=i) for i in range(3)]
    async with flavour_client("trtllm", max_loras=1, max_cpu_loras=2) as (c, _):
        for i in (0, 1, 2, 0):
            r = await c.post("/v1/chat/completions", json=chat_body("demo-base", **_lora(paths[i], 10 + i)))
            assert r.status_code == 200
        state = (await c.get("/_sim/engine")).json()
        assert state["weight_loads"] == 4  # id 10 left the host cache (2 entries) and came back
        assert sorted(state["cached"]) == [10, 12]


async def test_a_path_it_cannot_load_is_400_failed_to_load(tmp_path: Any) -> None:
    async with flavour_client("trtllm") as (c, _):
        r = await c.post(
            "/v1/chat/completions", json=chat_body("demo-base", **_lora(str(tmp_path / "no"), 9))
        )
        assert r.status_code == 400 and r.json()["object"] == "error"
        assert r.json()["message"].startswith("Failed to load LoRA adapter 9: ")
