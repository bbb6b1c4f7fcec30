"""Fault injection: in process through ``/_sim/faults``, and on real simulator processes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from simulator.config import FaultState, SimConfig
from simulator.engine import TimingParams
from simulator.procs import SimulatorStartError, start_simulators, stop_all
from tests.simulator.simutil import load, sim_client

MakeAdapter = Callable[..., str]


async def test_control_endpoints_absent_unless_enabled() -> None:
    async with sim_client() as (c, _):
        assert (await c.get("/_sim/state")).status_code == 404
        assert (await c.post("/_sim/faults", json={"dead": True})).status_code == 404


async def test_fail_next_loads_404_then_500(make_adapter: MakeAdapter) -> None:
    path = make_adapter()
    async with sim_client(enable_fault_control=True) as (c, _):
        r = await c.post("/_sim/faults", json={"fail_loads": 1, "fail_load_status": 404})
        assert r.status_code == 200 and r.json()["fail_loads"] == 1
        r = await load(c, "a", path)
        assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
        assert r.json()["error"]["message"] == "Loading lora a failed: No adapter found for <path>"
        await c.post("/_sim/faults", json={"fail_loads": 1, "fail_load_status": 500})
        r = await load(c, "a", path)
        assert r.status_code == 500 and r.json()["error"]["message"].startswith(
            "Call to add_lora method failed: "
        )
        assert (await load(c, "a", path)).status_code == 200  # only the next N fail
        state = (await c.get("/_sim/state")).json()
        assert state["load_calls"] == 3 and state["loads_ok"] == 1 and state["faults"]["fail_loads"] == 0


async def test_slow_loads_and_stall(make_adapter: MakeAdapter) -> None:
    async with sim_client(SimConfig(faults=FaultState(slow_load_s=0.3, stall_s=0.3))) as (c, _):
        t0 = time.monotonic()
        assert (await load(c, "a", make_adapter())).status_code == 200
        assert time.monotonic() - t0 >= 0.3
        t0 = time.monotonic()
        r = await c.post("/v1/completions", json={"model": "a", "prompt": "x"})
        assert r.status_code == 200 and time.monotonic() - t0 >= 0.3


async def test_dead_engine(make_adapter: MakeAdapter) -> None:
    async with sim_client(enable_fault_control=True) as (c, _):
        await c.post("/_sim/faults", json={"dead": True})
        assert (await c.get("/health")).status_code == 503
        r = await c.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
        assert (await load(c, "a", make_adapter())).status_code == 500
        await c.post("/_sim/faults", json={"reset": True})
        assert (await c.get("/health")).status_code == 200


async def test_engine_death_mid_stream_is_an_in_band_error() -> None:
    timing = TimingParams.zero(decode_base_s=0.05)
    async with sim_client(SimConfig(timing=timing)) as (c, app):

        async def kill_soon() -> None:
            await asyncio.sleep(0.3)
            app.config.faults.dead = True

        killer = asyncio.create_task(kill_soon())
        body = {"prompt": "x", "max_tokens": 40, "stream": True}
        r = await c.post("/v1/completions", json=body)
        await killer
        assert r.status_code == 200
        blocks = r.text.split("\n\n")
        assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"
        err = json.loads(blocks[-3][len("data: ") :])
        assert err["error"]["type"] == "InternalServerError" and err["error"]["code"] == 500
        assert 1 <= len(blocks) - 3 < 40  # some tokens, not all


async def test_exit_after_requests_in_process_marks_dead() -> None:
    async with sim_client(SimConfig(faults=FaultState(exit_after_requests=2))) as (c, _):
        for _ in range(2):
            assert (await c.post("/v1/completions", json={"prompt": "x"})).status_code == 200
        assert (await c.get("/health")).status_code == 503


async def test_bad_fault_updates_are_400() -> None:
    async with sim_client(enable_fault_control=True) as (c, _):
        for body in ({"nope": 1}, {"fail_load_status": 418}, {"slow_load_s": -1}, {"dead": "yes"}):
            r = await c.post("/_sim/faults", json=body)
            assert r.status_code == 400, body
        r = await c.post("/_sim/faults", content=b"[]")
        assert r.status_code == 400


def _stream_events(url: str, body: dict, headers: dict[str, str]) -> tuple[list[str], Exception | None]:
    got: list[str] = []
    try:
        with (
            httpx.Client(timeout=10) as client,
            client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r,
        ):
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got.append(line)
    except httpx.HTTPError as exc:
        return got, exc
    return got, None


def test_real_process_faults_auth_static_and_restart(make_adapter: MakeAdapter) -> None:
    static = make_adapter("static", seed=3)
    args = [
        "--zero-latency",
        "--enable-fault-control",
        "--api-key",
        "k1",
        "--lora-modules",
        f"static1={static}",
    ]
    procs = start_simulators(1, model="tinybase", extra_args=args, ready_timeout=120)
    try:
        p = procs[0]
        auth = {"Authorization": "Bearer k1"}
        assert httpx.get(f"{p.url}/v1/models").status_code == 401
        models = httpx.get(f"{p.url}/v1/models", headers=auth).json()["data"]
        assert [m["id"] for m in models] == ["tinybase", "static1"]
        assert httpx.get(f"{p.url}/metrics").status_code == 200
        body = {
            "model": "static1",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 8,
            "stream": True,
        }
        got, err = _stream_events(p.url, body, auth)
        assert err is None and got[-1] == "data: [DONE]"
        # die mid-stream after 2 tokens: the connection is cut, no [DONE]
        httpx.post(f"{p.url}/_sim/faults", json={"die_after_tokens": 2, "die_streams": 1})
        got, err = _stream_events(p.url, body, auth)
        assert err is not None, got
        assert "data: [DONE]" not in got and len(got) == 3  # role chunk + 2 tokens
        got, err = _stream_events(p.url, body, auth)  # only the next stream died
        assert err is None and got[-1] == "data: [DONE]"
        # exit after N requests: the process goes away
        httpx.post(f"{p.url}/_sim/faults", json={"exit_after_requests": p_requests(p.url) + 1})
        r = httpx.post(f"{p.url}/v1/completions", json={"prompt": "x"}, headers=auth)
        assert r.status_code == 200
        assert p.proc is not None
        p.proc.wait(timeout=10)
        assert not p.alive()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{p.url}/health")
        p.restart(timeout=120)
        assert httpx.get(f"{p.url}/health").status_code == 200
        models = httpx.get(f"{p.url}/v1/models", headers=auth).json()["data"]
        assert [m["id"] for m in models] == ["tinybase", "static1"]
        pid = p.pid
        p.kill()
        assert not p.alive() and pid is not None
        with pytest.raises(ProcessLookupError):
            import os

            os.kill(pid, 0)
    finally:
        stop_all(procs)


def p_requests(url: str) -> int:
    return int(httpx.get(f"{url}/_sim/state").json()["requests_done"])


def test_real_process_gate_and_start_dead(tmp_path: Path) -> None:
    procs = start_simulators(
        1,
        extra_args=["--zero-latency", "--start-dead"],
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"},
        ready_timeout=120,
    )
    try:
        url = procs[0].url
        assert httpx.get(f"{url}/health").status_code == 503
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path)})
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
    finally:
        stop_all(procs)
    with pytest.raises(SimulatorStartError, match="exited early"):
        start_simulators(1, extra_args=["--lora-modules", f"bad={tmp_path / 'none'}"], ready_timeout=120)
