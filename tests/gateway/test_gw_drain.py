"""SIGTERM drains a gateway process (SPEC §18): /readyz fails at once, new requests get 503
``draining``, streams in flight finish, the process exits 0."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from kit import localservices as ls

from .gw_platform import Platform, run_platform

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-drain")]


@pytest.fixture
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with run_platform(
        s3_server,
        redis_url,
        gateways=1,
        sim_args=("--zero-latency", "--enable-fault-control"),
        env={"LORAPLANE_DRAIN_S": "20"},
    ) as p:
        p.adapter("longone")
        p.admin.create_tenant("acme", limits={"rpm": 100_000})
        p.admin.put_grant("acme", "longone")
        p.keys["acme"] = p.admin.issue_key("acme")["key"]
        time.sleep(0.5)
        yield p


def test_sigterm_lets_streams_finish_and_refuses_new_requests(plat: Platform) -> None:
    url = plat.gateway_urls[0]
    headers = {"authorization": f"Bearer {plat.keys['acme']}"}
    body = {"model": "demo-base:longone", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body, timeout=30).status_code == 200
    for sim in plat.sim_urls:  # every stream pauses 3 s after its first token
        httpx.post(f"{sim}/_sim/faults", json={"stall_s": 3.0, "stall_after_tokens": 1}, timeout=5)
    out: dict[str, str] = {}

    def stream() -> None:
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", headers=headers, json={**body, "stream": True}, timeout=60
        ) as r:
            out["status"] = str(r.status_code)
            out["text"] = r.read().decode()

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(1.0)  # the stream is in flight, paused at the replica
    gateway = plat.procs[1]
    gateway.signal(signal.SIGTERM)
    time.sleep(0.3)
    ready = httpx.get(f"{url}/readyz", timeout=5)
    assert ready.status_code == 503 and ready.json()["draining"] is True
    refused = httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body, timeout=10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    assert refused.headers["retry-after"] == "1"
    t.join(30)
    assert out["status"] == "200" and out["text"].rstrip().endswith("data: [DONE]")
    assert '"error"' not in out["text"]
    assert gateway.wait(30) == 0
