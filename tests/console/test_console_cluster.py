"""The traffic page of a separate registry process, fed through Redis by two gateway processes
(``loraplane serve --role registry`` + 2 × ``--role gateway``, PostgreSQL, Redis, S3, simulators)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from kit import localservices as ls
from tests.gateway.gw_platform import ADMIN_TOKEN, Platform, run_platform

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("console-cluster")]


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LORAPLANE_CONSOLE_TRAFFIC_INTERVAL_S", "0.5")
        with run_platform(s3_server, redis_url) as p:
            p.adapter("support")
            p.admin.create_tenant("acme")
            p.admin.put_grant("acme", "support")
            p.keys["acme"] = p.admin.issue_key("acme")["key"]
            yield p


def test_registry_console_sums_the_traffic_both_gateways_published(plat: Platform) -> None:
    body = {"model": "demo-base:support", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {plat.keys['acme']}"}
    deadline = time.monotonic() + 10
    for url in plat.gateway_urls:  # each gateway learns of the key through the change feed
        while (
            httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30).status_code
            != 200
        ):
            assert time.monotonic() < deadline, "gateway never accepted the new key"
            time.sleep(0.1)
    sent = len(plat.gateway_urls)
    for url in plat.gateway_urls:
        for _ in range(3):
            r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)
            assert r.status_code == 200
            sent += 1

    with httpx.Client(base_url=plat.admin_url) as c:
        page = c.get("/admin/ui/signin")
        pre = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert pre is not None
        r = c.post("/admin/ui/signin", data={"csrf": pre.group(1), "token": ADMIN_TOKEN})
        assert r.status_code == 303
        deadline = time.monotonic() + 20
        requests = 0
        while time.monotonic() < deadline:
            html = c.get("/admin/ui/traffic").text
            assert "published to Redis by every gateway process" in html
            m = re.search(r'data-series="support/v1">.*?</th><td>v1</td>\s*<td>(\d+)</td>', html, re.S)
            requests = int(m.group(1)) if m else 0
            if requests == sent:
                break
            time.sleep(0.5)
    # readings taken before a gateway's first publish are its baseline, so the window may miss
    # the very first requests of a gateway, never count one twice
    assert sent - len(plat.gateway_urls) <= requests <= sent, (requests, sent)
