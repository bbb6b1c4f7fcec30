"""``canary_policy`` through ``PATCH /adapters/{id}`` (SPEC §16): stored whole with defaults,
shown on the adapter, audited, removable; a bad policy is one 422 listing every problem and
changes nothing."""

from __future__ import annotations

from fastapi.testclient import TestClient

from registry.canary.policy import CanaryPolicy
from tests.registry.core_support import seed_adapter

V1 = "/admin/v1"


def test_patch_sets_shows_and_removes_a_canary_policy(client: TestClient) -> None:
    seed_adapter(client)
    assert client.get(f"{V1}/adapters/support").json()["canary_policy"] is None
    r = client.patch(f"{V1}/adapters/support", json={"canary_policy": {"min_requests": 50, "window_s": 120}})
    assert r.status_code == 200, r.text
    want = {**CanaryPolicy().to_dict(), "min_requests": 50, "window_s": 120.0}
    assert r.json()["canary_policy"] == want
    assert client.get(f"{V1}/adapters/support").json()["canary_policy"] == want
    events = client.get(f"{V1}/audit", params={"action": "adapter.updated"}).json()["data"]
    assert events[-1]["details"] == {"canary_policy": want}
    # the same policy again changes nothing: no second event
    client.patch(f"{V1}/adapters/support", json={"canary_policy": {"min_requests": 50, "window_s": 120}})
    assert len(client.get(f"{V1}/audit", params={"action": "adapter.updated"}).json()["data"]) == 1
    r = client.patch(f"{V1}/adapters/support", json={"canary_policy": None})
    assert r.status_code == 200 and r.json()["canary_policy"] is None


def test_a_bad_policy_is_refused_with_every_problem(client: TestClient) -> None:
    seed_adapter(client)
    r = client.patch(
        f"{V1}/adapters/support",
        json={"description": "x", "canary_policy": {"min_requests": "many", "max_ttft_p99_ratio": 0, "x": 1}},
    )
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request"
    assert len(err["details"]["problems"]) == 3
    got = client.get(f"{V1}/adapters/support").json()
    assert got["canary_policy"] is None and got["description"] is None  # nothing half-written
    r = client.patch(f"{V1}/adapters/support", json={"canary_policy": "strict"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
