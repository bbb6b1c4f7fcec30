"""The Ray Serve LLM flavour: no load API; the first request for ``base:name`` reads the
published folder, downloads it into a disk cache keyed by the name and loads it; a per-replica
LRU of max_num_adapters_per_replica; /v1/models lists what is published; Ray's 404 texts."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from tests.simulator.flavourutil import chat_body, flavour_client, publish

MakeAdapter = Callable[..., str]


def _store(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "loras"
    root.mkdir()
    return root, f"file://{root}"


async def test_first_request_downloads_and_loads_the_published_folder(
    make_adapter: MakeAdapter, tmp_path: Path
) -> None:
    root, uri = _store(tmp_path)
    publish(make_adapter("a"), root, "a@v1-0000aaaa")
    async with flavour_client("ray-serve", dynamic_lora_loading_path=uri) as (c, _):
        assert (await c.get("/-/healthz")).text == "success"
        r = await c.post("/v1/chat/completions", json=chat_body("demo-base:a@v1-0000aaaa"))
        assert r.status_code == 200 and r.json()["model"] == "demo-base:a@v1-0000aaaa"
        await c.post("/v1/chat/completions", json=chat_body("demo-base:a@v1-0000aaaa"))
        state = (await c.get("/_sim/engine")).json()
        assert (state["first_hits"], state["downloads"]) == (1, 1)
        ids = [x["id"] for x in (await c.get("/v1/models")).json()["data"]]
        assert ids == ["demo-base", "demo-base:a@v1-0000aaaa"]
        assert (await c.get("/v1/models/demo-base:a@v1-0000aaaa")).status_code == 200
        assert (await c.get("/v1/models/demo-base:nope")).status_code == 404
        assert (await c.get("/metrics")).status_code == 404  # no engine metrics on the Serve port


async def test_unpublished_name_and_unknown_base_are_rays_404s(tmp_path: Path) -> None:
    _, uri = _store(tmp_path)
    async with flavour_client("ray-serve", dynamic_lora_loading_path=uri) as (c, _):
        r = await c.post("/v1/chat/completions", json=chat_body("demo-base:missing"))
        assert r.status_code == 404 and r.json()["error"]["code"] == 404
        assert 'Unable to find LoRA adapter config file "adapter_config.json"' in r.json()["error"]["message"]
        r = await c.post("/v1/chat/completions", json=chat_body("other-base:x"))
        assert r.status_code == 404
        assert 'Could not find base model with ID "other-base"' in r.json()["error"]["message"]


async def test_per_replica_lru_reloads_from_the_disk_cache(make_adapter: MakeAdapter, tmp_path: Path) -> None:
    root, uri = _store(tmp_path)
    for i, n in enumerate(("a", "b")):
        publish(make_adapter(n, seed=i), root, n)
    async with flavour_client("ray-serve", dynamic_lora_loading_path=uri, max_num_adapters_per_replica=1) as (
        c,
        _,
    ):
        for n in ("a", "b", "a"):
            assert (await c.post("/v1/chat/completions", json=chat_body(f"demo-base:{n}"))).status_code == 200
        state = (await c.get("/_sim/engine")).json()
        assert state["loaded"] == ["demo-base:a"]
        assert (state["first_hits"], state["downloads"], state["evictions"]) == (3, 2, 2)


async def test_the_disk_cache_keeps_old_bytes_under_a_reused_name(
    make_adapter: MakeAdapter, tmp_path: Path
) -> None:
    """Why names must be immutable per version: new bytes under an old name are never seen."""
    root, uri = _store(tmp_path)
    publish(make_adapter("old", seed=1), root, "same")
    async with flavour_client("ray-serve", dynamic_lora_loading_path=uri, max_num_adapters_per_replica=1) as (
        c,
        _,
    ):
        first = (await c.post("/v1/chat/completions", json=chat_body("demo-base:same"))).json()
        shutil.rmtree(root / "same")
        publish(make_adapter("new", seed=2), root, "same")
        publish(make_adapter("other", seed=3), root, "other")
        await c.post("/v1/chat/completions", json=chat_body("demo-base:other"))  # evicts "same"
        again = (await c.post("/v1/chat/completions", json=chat_body("demo-base:same"))).json()
        assert again["choices"][0]["message"] == first["choices"][0]["message"]
