"""The SGLang flavour: SGLang's load/unload answers and texts, its LRU over --max-loaded-loras,
implicit reload of a known name, pinning, ``base:adapter`` naming, /v1/models and /metrics."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from tests.simulator.flavourutil import chat_body, flavour_client

MakeAdapter = Callable[..., str]


async def test_load_answers_json_with_the_loaded_adapters_and_refuses_a_duplicate(
    make_adapter: MakeAdapter,
) -> None:
    path = make_adapter("a")
    async with flavour_client("sglang") as (c, _):
        assert (
            await c.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": path})
        ).status_code == 404
        r = await c.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": path})
        assert r.status_code == 200
        assert r.json() == {"success": True, "error_message": "", "loaded_adapters": {"a": path}}
        r = await c.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": path})
        assert r.status_code == 400
        assert r.json() == {
            "success": False,
            "error_message": "Failed to load LoRA adapter a because it is already loaded",
            "loaded_adapters": {"a": path},
        }
        cards = (await c.get("/v1/models")).json()["data"]
        assert [(x["id"], x["parent"], x["root"]) for x in cards] == [
            ("demo-base", None, "demo-base"),
            ("a", "demo-base", path),
        ]


async def test_requests_name_base_colon_adapter(make_adapter: MakeAdapter) -> None:
    async with flavour_client("sglang") as (c, _):
        await c.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": make_adapter("a")})
        r = await c.post("/v1/chat/completions", json=chat_body("demo-base:a"))
        assert r.status_code == 200 and r.json()["model"] == "demo-base:a"
        r = await c.post("/v1/chat/completions", json=chat_body("other:a"))
        assert r.status_code == 404
        assert r.json()["error"] == {
            "object": "error",
            "message": "Model 'other:a' is not served.",
            "type": "NotFound",
            "param": None,
            "code": 404,
        }
        r = await c.post("/v1/chat/completions", json=chat_body("demo-base:never"))
        assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequest"
        assert r.json()["error"]["message"].startswith("Got LoRA adapter that has never been loaded: never")


async def test_unloaded_name_is_reloaded_implicitly_by_the_next_request(make_adapter: MakeAdapter) -> None:
    path = make_adapter("a")
    async with flavour_client("sglang") as (c, _):
        await c.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": path})
        before = (await c.post("/v1/chat/completions", json=chat_body("demo-base:a"))).json()
        r = await c.post("/unload_lora_adapter", json={"lora_name": "a"})
        assert r.status_code == 200 and r.json()["loaded_adapters"] == {}
        assert [x["id"] for x in (await c.get("/v1/models")).json()["data"]] == ["demo-base"]
        after = (await c.post("/v1/chat/completions", json=chat_body("demo-base:a"))).json()
        assert after["choices"][0]["message"] == before["choices"][0]["message"]  # same weights
        assert "a" in [x["id"] for x in (await c.get("/v1/models")).json()["data"]]
        assert (await c.get("/_sim/engine")).json()["implicit_reloads"] == 1


async def test_unload_of_an_unknown_name_is_400_with_sglangs_text() -> None:
    async with flavour_client("sglang") as (c, _):
        r = await c.post("/unload_lora_adapter", json={"lora_name": "x"})
        assert r.status_code == 400
        assert r.json() == {
            "success": False,
            "error_message": "LoRA with name x does not exist. Loaded LoRAs: odict_keys([])",
            "loaded_adapters": None,
        }


async def test_max_loaded_loras_unloads_the_least_recently_used_unpinned(make_adapter: MakeAdapter) -> None:
    paths = {n: make_adapter(n, seed=i) for i, n in enumerate("abc")}
    async with flavour_client("sglang", max_loaded_loras=2) as (c, _):
        for n in "ab":
            await c.post("/load_lora_adapter", json={"lora_name": n, "lora_path": paths[n]})
        assert (await c.post("/v1/chat/completions", json=chat_body("demo-base:a"))).status_code == 200
        r = await c.post("/load_lora_adapter", json={"lora_name": "c", "lora_path": paths["c"]})
        assert r.status_code == 200 and sorted(r.json()["loaded_adapters"]) == ["a", "c"]  # b was LRU
        assert (await c.get("/_sim/engine")).json()["lru_unloads"] == 1


async def test_at_most_max_loras_minus_one_pinned_and_pinned_ones_stay(make_adapter: MakeAdapter) -> None:
    paths = {n: make_adapter(n, seed=i) for i, n in enumerate("abc")}
    async with flavour_client("sglang", max_loras=2, max_loaded_loras=2) as (c, _):
        ok = await c.post(
            "/load_lora_adapter", json={"lora_name": "a", "lora_path": paths["a"], "pinned": True}
        )
        assert ok.status_code == 200
        r = await c.post(
            "/load_lora_adapter", json={"lora_name": "b", "lora_path": paths["b"], "pinned": True}
        )
        assert r.status_code == 400
        assert r.json()["error_message"] == (
            "Already have 1 pinned adapters, max allowed is 1 (reserving 1 slot for dynamic use). "
            "Please unpin some adapters or increase max_loras_per_batch."
        )
        for n in "bc":  # unpinned: the LRU takes b, never the pinned a
            await c.post("/load_lora_adapter", json={"lora_name": n, "lora_path": paths[n]})
        state = (await c.get("/_sim/engine")).json()
        assert [(x["name"], x["pinned"]) for x in state["registry"]] == [("a", True), ("c", False)]


async def test_rank_over_the_pool_is_sglangs_incompatible_message(make_adapter: MakeAdapter) -> None:
    path = make_adapter("big", rank=128)
    async with flavour_client("sglang") as (c, _):
        r = await c.post("/load_lora_adapter", json={"lora_name": "big", "lora_path": path})
        assert r.status_code == 400
        assert r.json()["error_message"].startswith(
            "LoRA adapter big with rank 128 is incompatible with the current LoRA memory pool configuration."
        )


async def test_metrics_are_sglangs_gauges() -> None:
    async with flavour_client("sglang", max_loras=3) as (c, _):
        text = (await c.get("/metrics")).text
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"} <= set(fams)
        assert fams["sglang:lora_pool_slots_total"].samples[0].value == 3.0
