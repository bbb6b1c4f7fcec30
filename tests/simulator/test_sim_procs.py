"""A real simulator process in (scaled) real time: readiness, load latency, cold reloads, disconnects."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from simulator.procs import SimProcess

MakeAdapter = Callable[..., str]

ARGS = [
    "--decode-base-s", "0.02", "--decode-per-seq-s", "0", "--prefill-s-per-token", "0",
    "--load-fixed-s", "0.3", "--load-bytes-per-s", "1e12", "--cpu-cache-reload-s", "0",
    "--max-loras", "1", "--max-cpu-loras", "1", "--enable-fault-control",
]  # fmt: skip


def _state(url: str) -> dict:
    return httpx.get(f"{url}/_sim/state").json()  # type: ignore[no-any-return]


def test_real_time_process(make_adapter: MakeAdapter) -> None:
    p = SimProcess(extra_args=ARGS, ready_timeout=120).start()
    try:
        # (connection refused until ready: not asserted, a descheduled test process can lose that race)
        p.wait_ready()
        url = p.url
        # a load call takes the modelled load time
        t0 = time.monotonic()
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "A", "lora_path": make_adapter("A")})
        assert r.status_code == 200 and time.monotonic() - t0 >= 0.3
        r = httpx.post(
            f"{url}/v1/load_lora_adapter", json={"lora_name": "B", "lora_path": make_adapter("B", seed=2)}
        )
        assert r.status_code == 200
        st = _state(url)
        a_id = next(a["lora_id"] for a in st["adapters"] if a["name"] == "A")
        assert [s["name"] for s in st["engine"]["cpu_cache"]] == ["B"]  # A evicted (max_cpu_loras 1)
        # A is cold: its first token waits for a reload from disk
        t0 = time.monotonic()
        r = httpx.post(f"{url}/v1/completions", json={"model": "A", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200 and time.monotonic() - t0 >= 0.3
        assert _state(url)["engine"]["adapters"][str(a_id)]["disk_loads"] == 2
        # tokens stream at the step time; a client that goes away cancels its request
        body = {"model": "A", "prompt": "x", "max_tokens": 500, "stream": True}
        t0 = time.monotonic()
        with (
            httpx.Client(timeout=10) as client,
            client.stream("POST", f"{url}/v1/completions", json=body) as r,
        ):
            got = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got += 1
                if got == 5:
                    break
            assert time.monotonic() - t0 >= 0.1  # 5 engine steps of 20 ms
        for _ in range(100):
            if _state(url)["engine"]["running"] == 0:
                break
            time.sleep(0.05)
        assert _state(url)["engine"]["running"] == 0
        # same for a non-streaming request whose client gives up
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, timeout=0.5)
        for _ in range(100):
            if _state(url)["engine"]["running"] == 0:
                break
            time.sleep(0.05)
        assert _state(url)["engine"]["running"] == 0
        metrics = httpx.get(f"{url}/metrics").text
        assert (
            'vllm:request_success_total{engine="0",finished_reason="length",model_name="demo-base"} 1.0'
            in metrics
        )
    finally:
        p.cleanup()
    assert not p.alive()
