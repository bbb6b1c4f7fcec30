"""End to end through the product against real vLLM: registry (S3) → gateway (openai client) → router → vLLM.

Greedy (temperature 0) outputs tell which adapter version answered: they differ per version and
equal what a replica answers directly for that version's ``lora_name``.
The replica-kill test runs last (it leaves replica 1 dead for the rest of the session).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kit import localservices as ls
from tests.engine import vllm_env as ve
from tests.engine.conftest import ENGINE_MARKS, EngineEnv, make_engine_adapter
from tests.engine.product import BASE, MAX_ADAPTERS, TENANT, Platform, start_platform

pytestmark = ENGINE_MARKS

PROMPT = "the quick brown fox jumps over"
N_TOKENS = 10


@pytest.fixture(scope="module")
def platform(
    engine_env: EngineEnv,
    vllm_replicas: list[ve.VllmReplica],
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Platform]:
    for r in vllm_replicas:
        if not r.alive():
            r.stop()
            r.start()
            r.wait_ready()
    # Our own SeaweedFS S3 server (as the ``s3_server`` fixture) with a start-up timeout that
    # survives a machine loaded by two vLLM replicas.
    s3_server = ls.start_s3_server(timeout=300)
    try:
        with start_platform(
            replicas=vllm_replicas,
            model_dir=engine_env.model,
            module_shapes=engine_env.module_shapes,
            s3=s3_server,
            redis_url=redis_url,
            workdir=tmp_path_factory.mktemp("engine-platform"),
        ) as p:
            yield p
    finally:
        s3_server.stop()


@pytest.fixture
def client(platform: Platform) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{platform.gateway_url}/v1", api_key=platform.key, max_retries=0) as c:
        yield c


def new_adapter(
    platform: Platform, engine_env: EngineEnv, tmp: Path, prefix: str, seeds: list[int]
) -> tuple[str, list[str]]:
    """Create an adapter with one uploaded version per seed (not promoted); grant it to the tenant."""
    aid = f"{prefix}-{uuid.uuid4().hex[:6]}"
    versions = []
    with platform.admin() as admin:
        admin.create_adapter(aid, base_model=BASE, owner="engine-tests")
        for seed in seeds:
            d = make_engine_adapter(tmp / f"{aid}-{seed}", engine_env, seed=seed)
            _set_base(d, BASE)
            versions.append(str(admin.upload_version(aid, d)["version"]))
        admin.put_grant(TENANT, aid)
    return aid, versions


def _set_base(adapter_dir: Path, base: str) -> None:
    import json

    cfg_path = adapter_dir / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = base
    cfg_path.write_text(json.dumps(cfg, indent=2))


def ask(client: openai.OpenAI, model: str, prompt: str = PROMPT) -> tuple[str, str | None]:
    """Greedy completion through the gateway → (text, x-loraplane-adapter-version)."""
    raw = client.completions.with_raw_response.create(
        model=model, prompt=prompt, max_tokens=N_TOKENS, temperature=0, extra_body={"ignore_eos": True}
    )
    body = raw.parse()
    assert body.model == model
    return body.choices[0].text, raw.headers.get("x-loraplane-adapter-version")


def served(client: openai.OpenAI, model: str, version: str, timeout_s: float = 60.0) -> str:
    """Ask until the gateway serves ``version`` for ``model`` (it learns of changes within 1 s;
    the bound is generous because the first request may wait for a cold load on CPU vLLM)."""
    deadline = time.monotonic() + timeout_s
    seen: list[object] = []
    while time.monotonic() < deadline:
        try:
            text, hv = ask(client, model)
        except openai.NotFoundError as e:
            seen.append(e.status_code)
        else:
            if hv == version:
                return text
            seen.append(hv)
        time.sleep(0.05)
    raise AssertionError(f"{model} not served as {version} within {timeout_s}s: {seen[-5:]}")


def listed(platform: Platform, model: str, timeout_s: float = 30.0) -> None:
    """Wait until the gateway lists ``model`` for the tenant (without sending it any request)."""
    deadline = time.monotonic() + timeout_s
    with openai.OpenAI(base_url=f"{platform.gateway_url}/v1", api_key=platform.key, max_retries=0) as c:
        while time.monotonic() < deadline:
            if model in {m.id for m in c.models.list()}:
                return
            time.sleep(0.05)
    raise AssertionError(f"{model} not listed by the gateway within {timeout_s}s")


def loaded_names(replica: ve.VllmReplica) -> list[str]:
    r = httpx.get(f"{replica.url}/v1/models", timeout=10)
    return [c["id"] for c in r.json()["data"] if c["id"] != BASE]


def direct(platform: Platform, aid: str, version: str) -> str:
    """What a replica that has ``aid@version`` loaded answers directly for its lora_name."""
    for rep in platform.replicas:
        if not rep.alive():
            continue
        for name in loaded_names(rep):
            if name.startswith(f"{aid}@{version}-"):
                r = httpx.post(
                    f"{rep.url}/v1/completions",
                    json={
                        "model": name,
                        "prompt": PROMPT,
                        "max_tokens": N_TOKENS,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                    timeout=60,
                )
                assert r.status_code == 200, r.text
                return str(r.json()["choices"][0]["text"])
    where = [loaded_names(r) for r in platform.replicas if r.alive()]
    raise AssertionError(f"{aid}@{version} is loaded on no replica: {where}")


def audit(platform: Platform, action: str, aid: str) -> list[dict[str, Any]]:
    with platform.admin() as admin:
        return admin.list_audit(action=action, subject_id=aid)


def test_versions_differ_and_equal_direct_answers(
    platform: Platform, client: openai.OpenAI, engine_env: EngineEnv, tmp_path: Path
) -> None:
    aid, (v1, v2) = new_adapter(platform, engine_env, tmp_path, "ver", [11, 12])
    with platform.admin() as admin:
        admin.promote(aid, v1)
    model = f"{BASE}:{aid}"
    t1 = served(client, model, v1)
    assert t1 == direct(platform, aid, v1)
    t2, hv2 = ask(client, f"{model}@{v2}")
    assert hv2 == v2
    assert t2 == direct(platform, aid, v2)
    base, hb = ask(client, BASE)
    assert hb is None
    assert len({t1, t2, base}) == 3, (t1, t2, base)
    assert ask(client, model)[0] == t1  # deterministic through the gateway
    loads = audit(platform, "adapter.loaded", aid)
    assert {e["details"]["version"] for e in loads} >= {v1, v2}


def test_rollback_in_force_at_once_and_switches_outputs(
    platform: Platform, client: openai.OpenAI, engine_env: EngineEnv, tmp_path: Path
) -> None:
    aid, (v1, v2) = new_adapter(platform, engine_env, tmp_path, "rb", [21, 22])
    model = f"{BASE}:{aid}"
    with platform.admin() as admin:
        admin.promote(aid, v1)
        t1 = served(client, model, v1)
        admin.promote(aid, v2)
        t2 = served(client, model, v2)
        assert t2 != t1
        before = httpx.get(f"{platform.gateway_url}/readyz").json()["routing_table"]["revision"]
        admin.rollback(aid)
        t_rb = time.monotonic()
        returned = time.time()
    # The switch itself: the gateway's own clock of when it installed the new routing table.
    deadline = time.monotonic() + 10
    table: dict[str, Any] = {}
    while time.monotonic() < deadline:
        table = httpx.get(f"{platform.internal_url}/readyz").json()["routing_table"]
        if table["revision"] > before:
            break
        time.sleep(0.005)
    assert table["revision"] > before, table
    switch_s = table["changed_at"] - returned
    # A CPU vLLM answer takes about a second here, so one request after another cannot show a
    # sub-second switch: fire requests at fixed offsets after the rollback returned and record
    # when each started. The gateway picks the version at admission.
    seen: list[tuple[float, str | None, str]] = []

    def probe(offset: float) -> None:
        delay = t_rb + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        started = time.monotonic() - t_rb
        text, hv = ask(client, model)
        seen.append((started, hv, text))

    with cf.ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(probe, o) for o in (0.0, 0.25, 0.5, 0.75, 0.9, 1.25, 2.0, 3.0)]:
            f.result(timeout=120)
    seen.sort()
    print(f"\nrollback in force {switch_s * 1000:.1f} ms after the admin call returned; probes {seen}")
    assert all(text == t1 for _, hv, text in seen if hv == v1), seen
    # every request admitted after the switch is served by the rolled-back-to version
    assert all(hv == v1 for started, hv, _ in seen if started > switch_s + 0.05), (switch_s, seen)
    # SPEC: in force within 1 s (goal well under 100 ms); tests/gateway/test_gw_e2e.py holds the
    # median of six flips to 1 s, this single flip next to a busy CPU vLLM gets twice that.
    assert switch_s < 2.0, f"rollback in force only {switch_s:.2f}s after the admin call: {seen}"


def test_canary_split_serves_both_versions(
    platform: Platform, client: openai.OpenAI, engine_env: EngineEnv, tmp_path: Path
) -> None:
    aid, (v1, v2) = new_adapter(platform, engine_env, tmp_path, "can", [31, 32])
    model = f"{BASE}:{aid}"
    with platform.admin() as admin:
        admin.promote(aid, v1)
    served(client, model, v1)
    with platform.admin() as admin:
        admin.promote(aid, v2, canary_weight=50)
    # The canary is live once it has served one request. Each request is a coin flip (50 %) and a
    # CPU vLLM answer plus the canary's cold load take seconds, so allow many draws.
    served(client, model, v2, timeout_s=60.0)
    texts: dict[str | None, set[str]] = {}
    for _ in range(20):
        text, hv = ask(client, model)
        texts.setdefault(hv, set()).add(text)
    assert set(texts) == {v1, v2}, texts
    assert all(len(t) == 1 for t in texts.values()), texts  # one output per version
    assert texts[v1] != texts[v2]


def test_disable_refuses_and_unloads(
    platform: Platform, client: openai.OpenAI, engine_env: EngineEnv, tmp_path: Path
) -> None:
    aid, (v1,) = new_adapter(platform, engine_env, tmp_path, "dis", [41])
    model = f"{BASE}:{aid}"
    with platform.admin() as admin:
        admin.promote(aid, v1)
        served(client, model, v1)
        assert any(n.startswith(f"{aid}@") for r in platform.replicas for n in loaded_names(r))
        admin.disable_adapter(aid)
    deadline = time.monotonic() + 15
    refused: openai.PermissionDeniedError | None = None
    while refused is None and time.monotonic() < deadline:
        try:
            ask(client, model)
        except openai.PermissionDeniedError as e:
            refused = e
    assert refused is not None and refused.status_code == 403
    assert "adapter_disabled" in str(refused.body)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not any(n.startswith(f"{aid}@") for r in platform.replicas for n in loaded_names(r)):
            break
        time.sleep(0.3)
    assert not any(n.startswith(f"{aid}@") for r in platform.replicas for n in loaded_names(r))
    assert audit(platform, "adapter.unloaded", aid)


def test_eviction_keeps_max_adapters_per_replica(
    platform: Platform, client: openai.OpenAI, engine_env: EngineEnv, tmp_path: Path
) -> None:
    n = 2 * MAX_ADAPTERS + 1
    ids = []
    for i in range(n):
        aid, (v1,) = new_adapter(platform, engine_env, tmp_path, f"ev{i}", [50 + i])
        with platform.admin() as admin:
            admin.promote(aid, v1)
        ids.append((aid, v1))
    outputs = {}
    for aid, v1 in ids:
        outputs[aid] = served(client, f"{BASE}:{aid}", v1)
        for rep in platform.replicas:
            assert len(loaded_names(rep)) <= MAX_ADAPTERS, loaded_names(rep)
    assert len(set(outputs.values())) == n  # every adapter answered with its own weights
    assert any(audit(platform, "adapter.unloaded", aid) for aid, _ in ids)
    # an evicted adapter comes back on demand with the same output
    assert ask(client, f"{BASE}:{ids[0][0]}")[0] == outputs[ids[0][0]]


def test_tampered_object_is_never_loaded(
    platform: Platform, client: openai.OpenAI, engine_env: EngineEnv, tmp_path: Path
) -> None:
    aid, (v1,) = new_adapter(platform, engine_env, tmp_path, "tam", [61])
    with platform.admin() as admin:
        version = admin.get_version(aid, v1)
        admin.promote(aid, v1)
    uri = str(version["storage_uri"])
    assert uri.startswith(f"s3://{platform.bucket}/")
    key = uri[len(f"s3://{platform.bucket}/") :].rstrip("/") + "/adapter_model.safetensors"
    s3 = platform.s3.client()
    blob = s3.get_object(Bucket=platform.bucket, Key=key)["Body"].read()
    tampered = blob[:-8] + bytes(8 * [0x41])
    s3.put_object(Bucket=platform.bucket, Key=key, Body=tampered)
    deadline = time.monotonic() + 15
    status = 404
    while status == 404 and time.monotonic() < deadline:  # until the gateway knows the version
        with pytest.raises(openai.APIStatusError) as ei:
            ask(client, f"{BASE}:{aid}")
        status = ei.value.status_code
    assert status == 503, ei.value
    assert not any(n.startswith(f"{aid}@") for r in platform.replicas for n in loaded_names(r))
    assert audit(platform, "adapter.hash_mismatch", aid)
    assert not audit(platform, "adapter.loaded", aid)


def test_version_vllm_refuses_falls_back_to_previous_version(
    platform: Platform, client: openai.OpenAI, engine_env: EngineEnv, tmp_path: Path
) -> None:
    aid = f"fb-{uuid.uuid4().hex[:6]}"
    with platform.admin() as admin:
        admin.create_adapter(aid, base_model=BASE, owner="engine-tests")
        admin.request("PATCH", f"/adapters/{aid}", json_body={"on_load_failure": "previous_version"})
        for seed, rank in ((81, 8), (82, 32)):  # v2: rank 32 > the replicas' --max-lora-rank 16
            d = make_engine_adapter(tmp_path / f"{aid}-{seed}", engine_env, seed=seed, rank=rank)
            _set_base(d, BASE)
            admin.upload_version(aid, d)
        admin.put_grant(TENANT, aid)
        admin.promote(aid, "v1")
    v1_text = served(client, f"{BASE}:{aid}", "v1")
    with platform.admin() as admin:
        admin.promote(aid, "v2")
    deadline = time.monotonic() + 60
    headers: dict[str, str] = {}
    while time.monotonic() < deadline and headers.get("x-loraplane-fallback") is None:
        raw = client.completions.with_raw_response.create(
            model=f"{BASE}:{aid}", prompt=PROMPT, max_tokens=N_TOKENS, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        headers = dict(raw.headers)
        text = raw.parse().choices[0].text
    assert headers.get("x-loraplane-fallback") == "previous_version", headers
    assert headers["x-loraplane-adapter-version"] == "v1" and text == v1_text
    failed = audit(platform, "adapter.load_failed", aid)
    assert failed and {e["details"]["reason"] for e in failed} == {"rejected"}
    with pytest.raises(openai.APIStatusError) as ei:  # pinned: never a fallback
        ask(client, f"{BASE}:{aid}@v2")
    assert ei.value.status_code == 503


def test_singleflight_one_load_per_replica(platform: Platform, engine_env: EngineEnv, tmp_path: Path) -> None:
    aid, (v1,) = new_adapter(platform, engine_env, tmp_path, "sf", [71])
    with platform.admin() as admin:
        admin.promote(aid, v1)
    model = f"{BASE}:{aid}"
    listed(platform, model)

    def one(_: int) -> tuple[str, str | None]:
        with openai.OpenAI(base_url=f"{platform.gateway_url}/v1", api_key=platform.key, max_retries=0) as c:
            return ask(c, model)

    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert {hv for _, hv in results} == {v1}
    assert len({t for t, _ in results}) == 1
    loads = audit(platform, "adapter.loaded", aid)
    per_replica: dict[str, int] = {}
    for e in loads:
        per_replica[e["details"]["replica"]] = per_replica.get(e["details"]["replica"], 0) + 1
    assert loads and all(c == 1 for c in per_replica.values()), per_replica


def test_zz_replica_killed_mid_traffic_fails_over(
    platform: Platform, engine_env: EngineEnv, tmp_path: Path
) -> None:
    aid, (v1,) = new_adapter(platform, engine_env, tmp_path, "fo", [81])
    with platform.admin() as admin:
        admin.promote(aid, v1)
        admin.prewarm(aid, replicas=2)
    model = f"{BASE}:{aid}"
    with openai.OpenAI(base_url=f"{platform.gateway_url}/v1", api_key=platform.key, max_retries=0) as c:
        served(c, model, v1)
    victim = platform.replicas[1]
    errors: list[str] = []
    texts: set[str] = set()

    def one(i: int) -> None:
        with openai.OpenAI(
            base_url=f"{platform.gateway_url}/v1", api_key=platform.key, max_retries=0, timeout=60
        ) as c:
            try:
                texts.add(ask(c, model)[0])
            except openai.APIError as e:
                errors.append(f"{i}: {e!r}")

    with cf.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(one, i) for i in range(6)]
        time.sleep(0.3)
        victim.kill()
        futs += [pool.submit(one, i) for i in range(6, 20)]
        for f in futs:
            f.result(timeout=120)
    assert not errors, errors
    assert len(texts) == 1
    deadline = time.monotonic() + 30
    record: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with platform.admin() as admin:
            record = {r["url"]: r for r in admin.list_replicas()}
        if record.get(victim.url, {}).get("healthy") is False:
            break
        time.sleep(0.3)
    assert record[victim.url]["healthy"] is False, record
    assert record[platform.replicas[0].url]["healthy"] is True
    victim.stop(grace_s=1)
