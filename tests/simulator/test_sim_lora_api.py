"""Dynamic LoRA endpoints: gate, success bodies, the error table of (as vLLM 0.32 does) validation."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from simulator.adapters import sanitize_message
from simulator.config import SimConfig
from tests.simulator.simutil import load, sim_client

MakeAdapter = Callable[..., str]


async def test_gate_off_routes_are_absent(make_adapter: MakeAdapter) -> None:
    async with sim_client(allow_runtime_lora=False) as (c, _):
        r = await load(c, "a", make_adapter())
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
        r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
        assert (await c.post("/adapters", json={"name": "a", "src": "/x"})).status_code == 404


async def test_get_on_live_route_is_405() -> None:
    async with sim_client() as (c, _):
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            r = await c.get(path)
            assert r.status_code == 405 and r.json() == {"detail": "Method Not Allowed"}


async def test_success_is_plain_text_without_content_type(make_adapter: MakeAdapter) -> None:
    async with sim_client() as (c, _):
        r = await load(c, "a", make_adapter())
        assert r.status_code == 200
        assert r.text == "Success: LoRA adapter 'a' added successfully."
        assert "content-type" not in r.headers
        r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
        assert r.status_code == 200
        assert r.text == "Success: LoRA adapter 'a' removed successfully."
        assert "content-type" not in r.headers


def _err(r: object) -> dict[str, object]:
    body = r.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == r.status_code  # type: ignore[attr-defined]
    return body["error"]  # type: ignore[no-any-return]


async def test_validation_and_user_input_errors(make_adapter: MakeAdapter) -> None:
    path = make_adapter()
    async with sim_client() as (c, _):
        r = await c.post("/v1/load_lora_adapter", json={"lora_name": "a"})
        e = _err(r)
        assert r.status_code == 400 and e["type"] == "Bad Request" and e["param"] == "body.lora_path"
        assert e["message"] == (
            "1 validation error:\n  {'type': 'missing', 'loc': 'body.lora_path', 'msg': 'Field required', "
            "'input': '<dict of 1 items>'}"
        )
        r = await c.post("/v1/load_lora_adapter", json={"lora_name": 5, "lora_path": path})
        assert r.status_code == 400 and _err(r)["type"] == "Bad Request"
        r = await c.post(
            "/v1/load_lora_adapter", content=b"lora_name=a", headers={"content-type": "text/plain"}
        )
        e = _err(r)
        assert r.status_code == 400 and e["type"] == "Bad Request"
        assert (
            e["message"]
            == "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
        )
        r = await c.post(
            "/v1/load_lora_adapter", content=b"{nope", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and _err(r)["type"] == "Bad Request"
        r = await load(c, "", path)
        assert r.status_code == 400 and _err(r) == {
            "message": "Both 'lora_name' and 'lora_path' must be provided.",
            "type": "InvalidUserInput",
            "param": None,
            "code": 400,
        }
        r = await load(c, "demo-base", path)
        assert _err(r)["message"] == "The lora adapter 'demo-base' conflicts with a served base model."
        assert (await load(c, "a", path)).status_code == 200
        r = await load(c, "a", path)
        assert r.status_code == 400 and _err(r)["message"] == (
            "The lora adapter 'a' has already been loaded. If you want to load the adapter in place, "
            "set 'load_inplace' to True."
        )
        r = await c.post("/v1/unload_lora_adapter", json={"lora_name": ""})
        assert r.status_code == 400 and _err(r)["type"] == "InvalidUserInput"
        assert _err(r)["message"] == "'lora_name' needs to be provided to unload a LoRA adapter."
        r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "zzz"})
        assert r.status_code == 404 and _err(r) == {
            "message": "The lora adapter 'zzz' cannot be found.",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        }


async def test_not_found_is_404_with_redacted_path(tmp_path: Path) -> None:
    async with sim_client() as (c, _):
        r = await load(c, "ghost", str(tmp_path / "nothing-here"))
        e = _err(r)
        assert r.status_code == 404 and e["type"] == "NotFoundError"
        assert e["message"] == "Loading lora ghost failed: No adapter found for <path>"
        r = await load(c, "hub", "some-org/some-repo")  # not local: vLLM would try the hub
        assert r.status_code == 404 and str(_err(r)["message"]).startswith(
            "Loading lora hub failed: No adapter found"
        )


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"rank": 128}, "LoRA rank 128 is greater than max_lora_rank 64."),
        ({"config_overrides": {"use_dora": True}}, "vLLM does not yet support DoRA."),
        ({"config_overrides": {"bias": "all"}}, "Adapter bias is not supported."),
        ({"config_overrides": {"modules_to_save": ["lm_head"]}}, "modules_to_save"),
        ({"config_overrides": {"r": 0}}, "LoRA rank `r` must be a positive integer, got 0."),
        ({"config_overrides": {"lora_bias": True}}, "vLLM does not support LoRA bias (lora_bias)."),
    ],
)
async def test_engine_side_rejections_are_500(make_adapter: MakeAdapter, kwargs: dict, reason: str) -> None:
    path = make_adapter("bad", **kwargs)
    async with sim_client() as (c, _):
        r = await load(c, "bad", path)
        e = _err(r)
        assert r.status_code == 500 and e["type"] == "InternalServerError"
        assert str(e["message"]).startswith("Call to add_lora method failed: ")
        assert reason in str(e["message"])
        assert (await c.get("/health")).status_code == 200  # the server stays healthy


async def test_classifier_modules_to_save_is_accepted(make_adapter: MakeAdapter) -> None:
    path = make_adapter("cls", config_overrides={"modules_to_save": ["score"]})
    async with sim_client() as (c, _):
        assert (await load(c, "cls", path)).status_code == 200


async def test_missing_fields_weights_and_tensors(make_adapter: MakeAdapter) -> None:
    async with sim_client() as (c, _):
        p = Path(make_adapter("nofields"))
        cfg = json.loads((p / "adapter_config.json").read_text())
        del cfg["r"], cfg["lora_alpha"]
        (p / "adapter_config.json").write_text(json.dumps(cfg))
        r = await load(c, "x1", str(p))
        assert r.status_code == 500
        assert _err(r)["message"] == (
            "Call to add_lora method failed: Missing required configuration fields: {'lora_alpha', 'r'}"
        )
        p = Path(make_adapter("noweights"))
        (p / "adapter_model.safetensors").unlink()
        r = await load(c, "x2", str(p))
        assert r.status_code == 500 and _err(r)["message"] == (
            "Call to add_lora method failed: <path> doesn't contain tensors"
        )
        p = Path(make_adapter("corrupt"))
        (p / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
        r = await load(c, "x3", str(p))
        assert r.status_code == 500 and "deserializing header" in str(_err(r)["message"])
        p = Path(make_adapter("empty"))
        (p / "adapter_model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
        r = await load(c, "x4", str(p))
        assert r.status_code == 500 and "doesn't contain tensors" in str(_err(r)["message"])
        p = Path(make_adapter("badmod", target_modules=["q_proj", "conv9"]))
        r = await load(c, "x5", str(p))
        assert r.status_code == 500 and "expected target modules" in str(_err(r)["message"])
        models = (await c.get("/v1/models")).json()["data"]
        assert [m["id"] for m in models] == ["demo-base"]  # nothing half-loaded


async def test_wrapped_worker_errors(make_adapter: MakeAdapter) -> None:
    async with sim_client(SimConfig(wrap_worker_errors=True, max_lora_rank=16)) as (c, _):
        r = await load(c, "big", make_adapter("big", rank=32))
        assert _err(r)["message"] == (
            "Call to add_lora method failed: Worker failed with error 'LoRA rank 32 is greater than "
            "max_lora_rank 16.', please check the stack trace above for the root cause"
        )


async def test_load_inplace_unload_and_reload_identity(make_adapter: MakeAdapter) -> None:
    p1, p2 = make_adapter("v1", seed=1), make_adapter("v2", seed=2)
    async with sim_client(enable_fault_control=True) as (c, app):
        assert (await load(c, "a", p1)).status_code == 200
        id1 = app.adapters["a"].lora_id
        sha1 = app.adapters["a"].sha256
        assert (await load(c, "a", p2, load_inplace=True)).status_code == 200
        assert app.adapters["a"].lora_id == id1  # same id, re-read
        assert app.adapters["a"].sha256 != sha1
        assert (await load(c, "a", p2, load_inplace=True)).status_code == 200
        assert app.adapters["a"].lora_id == id1
        assert (await c.post("/v1/unload_lora_adapter", json={"lora_name": "a"})).status_code == 200
        state = (await c.get("/_sim/state")).json()
        assert state["adapters"] == []
        assert id1 in [s["lora_id"] for s in state["engine"]["gpu_slots"]]  # residency persists
        r = await c.post("/v1/completions", json={"model": "a", "prompt": "hi"})
        assert r.status_code == 404
        assert (await load(c, "a", p1)).status_code == 200
        assert app.adapters["a"].lora_id != id1  # a reload gets a new id
        assert state["load_calls"] == 3


async def test_sagemaker_aliases(make_adapter: MakeAdapter) -> None:
    async with sim_client() as (c, _):
        r = await c.post("/adapters", json={"name": "sm", "src": make_adapter()})
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sm' added successfully."
        r = await c.delete("/adapters/sm")
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sm' removed successfully."
        assert (await c.delete("/adapters/sm")).status_code == 404


async def test_static_lora_modules_and_failure_aborts_startup(
    make_adapter: MakeAdapter, tmp_path: Path
) -> None:
    path = make_adapter("st")
    async with sim_client(lora_modules=[("static1", path)], allow_runtime_lora=False) as (c, _):
        data = (await c.get("/v1/models")).json()["data"]
        assert [m["id"] for m in data] == ["demo-base", "static1"]
        r = await c.post("/v1/completions", json={"model": "static1", "prompt": "x"})
        assert r.status_code == 200 and r.json()["model"] == "static1"
    with pytest.raises(RuntimeError, match="static"):
        async with sim_client(lora_modules=[("bad", str(tmp_path / "none"))]):
            pass


def test_sanitize_message() -> None:
    assert sanitize_message("No adapter found for /tmp/x/y") == "No adapter found for <path>"
    assert sanitize_message("/home/u/a doesn't contain tensors") == "<path> doesn't contain tensors"
    assert sanitize_message("file x/adapters/a/adapter_config.json bad") == "file x<path> bad"
    assert sanitize_message("<Foo object at 0x7f00>") == "<Foo object>"
    assert sanitize_message("LoRA rank 32 is greater than max_lora_rank 16.") == (
        "LoRA rank 32 is greater than max_lora_rank 16."
    )
    assert sanitize_message("org/repo") == "org/repo"
