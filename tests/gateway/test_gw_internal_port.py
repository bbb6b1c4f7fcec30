"""The public surface is the OpenAI API only (SPEC §19), on real ``loraplane serve --role gateway``
processes: the public port refuses ``/metrics`` and its ``/readyz`` carries reason codes, never
internal error text or addresses; the internal port (``LORAPLANE_GATEWAY_INTERNAL_PORT``) serves
``/metrics`` and the detailed ``/readyz``, and nothing of the OpenAI API."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kit import localservices as ls
from kit.procs import ManagedProcess, http_ready, log_ready
from tests.gateway.gw_platform import Platform, run_platform

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-internal")]

PUBLIC_READYZ_KEYS = {
    "ready",
    "reasons",
    "warnings",
    "draining",
    "replicas_healthy",
    "routing_table",
    "ratelimit",
}
CODE = re.compile(r"^[a-z][a-z_]*$")


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with run_platform(s3_server, redis_url, gateways=1) as p:
        p.adapter("alpha")
        p.admin.create_tenant("acme", base_model_access=True)
        p.admin.put_grant("acme", "alpha")
        p.keys["acme"] = p.admin.issue_key("acme")["key"]
        yield p


def _auth(p: Platform) -> dict[str, str]:
    return {"authorization": f"Bearer {p.keys['acme']}"}


def _leaks(text: str, *needles: str) -> list[str]:
    return [n for n in needles if n and n in text]


def _assert_public_readyz(body: dict[str, Any]) -> None:
    assert set(body) == PUBLIC_READYZ_KEYS, body
    assert all(CODE.match(c) for c in (*body["reasons"], *body["warnings"])), body
    assert set(body["routing_table"]) == {"loaded", "stale", "revision", "age_s"}, body
    assert set(body["ratelimit"]) == {"healthy", "on_error"}, body


def test_public_port_refuses_metrics_and_the_internal_port_serves_them(plat: Platform) -> None:
    public, internal = plat.gateway_urls[0], plat.internal_urls[0]
    deadline = time.monotonic() + 10  # the key reaches the gateway through the change feed
    while httpx.get(f"{public}/v1/models", headers=_auth(plat)).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = httpx.post(
        f"{public}/v1/chat/completions",
        headers=_auth(plat),
        json={"model": "demo-base:alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    refused = httpx.get(f"{public}/metrics")
    assert refused.status_code == 404 and "loraplane_" not in refused.text
    assert httpx.post(f"{public}/metrics").status_code == 404  # no route, not "use GET"
    m = httpx.get(f"{internal}/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    assert 'loraplane_gateway_requests_total{adapter="alpha",code="200"' in m.text
    assert "loraplane_replicas_healthy" in m.text  # the router's metrics too
    # the internal port serves nothing of the OpenAI API
    assert httpx.get(f"{internal}/v1/models", headers={"authorization": "Bearer x"}).status_code == 404
    assert httpx.get(f"{internal}/openapi.json").status_code == 404
    # the public port keeps /v1/*, /healthz, /readyz and the API's own OpenAPI document
    assert httpx.get(f"{public}/healthz").status_code == 200
    assert httpx.get(f"{public}/openapi.json").status_code == 200


def test_public_readyz_has_codes_only_and_the_internal_one_the_details(plat: Platform) -> None:
    public, internal = plat.gateway_urls[0], plat.internal_urls[0]
    r = httpx.get(f"{public}/readyz")
    assert r.status_code == 200
    _assert_public_readyz(r.json())
    detail = httpx.get(f"{internal}/readyz").json()
    assert detail["ratelimit"]["backend"] == "redis" and "last_error" in detail["routing_table"]
    assert detail["routing_table"]["revision"] == r.json()["routing_table"]["revision"]


def test_readyz_of_a_gateway_that_cannot_reach_redis_names_no_address(plat: Platform) -> None:
    """A gateway whose Redis is unreachable (``closed`` mode): the public /readyz says 503 with the
    code ``ratelimit_store_unreachable`` and nothing else; the internal one has the words."""
    env: dict[str, str] = dict(plat.procs[1].env or {})
    dead = f"redis://127.0.0.1:{ls.free_port()}/0"
    port, internal_port = ls.free_port(), ls.free_port()
    env.update(
        {
            "LORAPLANE_REDIS_URL": dead,
            "LORAPLANE_REDIS_TIMEOUT_S": "0.5",
            "LORAPLANE_GATEWAY_PORT": str(port),
            "LORAPLANE_GATEWAY_INTERNAL_PORT": str(internal_port),
        }
    )
    argv = [sys.executable, "-m", "loraplane.cli", "serve", "--role", "gateway"]
    proc = ManagedProcess(
        argv, env=env, log_path=plat.workdir / "gateway-deadredis.log", name="gw-dead-redis"
    )
    proc.start()
    try:
        public, internal = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{internal_port}"
        proc.wait_ready(http_ready(f"{public}/healthz"), 90)
        r = httpx.get(f"{public}/readyz", timeout=10)
        assert r.status_code == 503
        body = r.json()
        _assert_public_readyz(body)
        assert body["reasons"] == ["ratelimit_store_unreachable"]
        assert body["ratelimit"] == {"healthy": False, "on_error": "closed"}
        db = env["LORAPLANE_DATABASE_URL"]
        assert not _leaks(r.text, dead, "127.0.0.1", "redis://", db, "postgresql", "Error", "refused"), r.text
        detail = httpx.get(f"{internal}/readyz", timeout=10)
        assert detail.status_code == 503
        assert detail.json()["messages"] == [
            "rate-limit store unreachable: ratelimit_on_error=closed (refusing requests)"
        ]
    finally:
        proc.stop(grace_s=10)


def test_internal_port_equal_to_the_public_port_is_refused_at_start(plat: Platform) -> None:
    env: dict[str, str] = dict(plat.procs[1].env or {})
    port = ls.free_port()
    env.update({"LORAPLANE_GATEWAY_PORT": str(port), "LORAPLANE_GATEWAY_INTERNAL_PORT": str(port)})
    log = plat.workdir / "gateway-sameport.log"
    argv = [sys.executable, "-m", "loraplane.cli", "serve", "--role", "gateway"]
    proc = ManagedProcess(argv, env=env, log_path=log, name="gw-same-port").start()
    try:
        assert proc.wait(60) != 0
        assert "must differ from gateway_port" in log.read_text()
    finally:
        proc.stop(grace_s=5)


def test_no_internal_port_means_no_metrics_anywhere_and_a_warning(plat: Platform) -> None:
    env: dict[str, str] = {k: v for k, v in (plat.procs[1].env or {}).items()}
    env.pop("LORAPLANE_GATEWAY_INTERNAL_PORT", None)
    port = ls.free_port()
    env.update({"LORAPLANE_GATEWAY_PORT": str(port), "LORAPLANE_LOG_LEVEL": "WARNING"})
    log = plat.workdir / "gateway-nointernal.log"
    argv = [sys.executable, "-m", "loraplane.cli", "serve", "--role", "gateway"]
    proc = ManagedProcess(argv, env=env, log_path=log, name="gw-no-internal").start()
    try:
        proc.wait_ready(log_ready(log, "LORAPLANE_GATEWAY_INTERNAL_PORT is not set"), 90)
        proc.wait_ready(http_ready(f"http://127.0.0.1:{port}/readyz"), 90)
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 404
    finally:
        proc.stop(grace_s=10)
