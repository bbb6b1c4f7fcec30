"""An evaluation (SPEC §16) through the product in front of real vLLM: the tiny model with two
versions of one adapter whose weights differ. Every case goes gateway → router → vLLM for the
bare base model, the active version (v1) and the candidate (v2), greedy with a fixed seed; the
result holds three different outputs per case, and the verdict sets v2's quality gate."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit import localservices as ls
from tests.engine import vllm_env as ve
from tests.engine.conftest import ENGINE_MARKS, EngineEnv, make_engine_adapter
from tests.engine.product import BASE, Platform, start_platform

pytestmark = ENGINE_MARKS

PROMPTS = ["the quick brown fox jumps over", "once upon a time there was", "in the beginning the"]


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
    s3_server = ls.start_s3_server(timeout=300)
    try:
        with start_platform(
            replicas=vllm_replicas,
            model_dir=engine_env.model,
            module_shapes=engine_env.module_shapes,
            s3=s3_server,
            redis_url=redis_url,
            workdir=tmp_path_factory.mktemp("engine-eval"),
        ) as p:
            yield p
    finally:
        s3_server.stop()


def _upload(platform: Platform, engine_env: EngineEnv, tmp: Path, aid: str, seed: int) -> str:
    d = make_engine_adapter(tmp / f"{aid}-{seed}", engine_env, seed=seed)
    cfg_path = d / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = BASE
    cfg_path.write_text(json.dumps(cfg, indent=2))
    with platform.admin() as admin:
        return str(admin.upload_version(aid, d)["version"])


def test_evaluation_on_real_vllm_outputs_differ_between_arms(
    platform: Platform, engine_env: EngineEnv, tmp_path: Path
) -> None:
    aid = f"evalq-{uuid.uuid4().hex[:6]}"
    with platform.admin() as admin:
        admin.create_adapter(aid, base_model=BASE, owner="engine-tests")
    v1 = _upload(platform, engine_env, tmp_path, aid, seed=1)
    v2 = _upload(platform, engine_env, tmp_path, aid, seed=2)
    cases = [
        {
            "id": f"p{i}",
            "prompt": prompt,
            "max_tokens": 8,
            "checks": [
                {"type": "max_chars", "n": 10_000},
                {"type": "not_contains", "text": "<never-in-an-answer>"},
            ],
        }
        for i, prompt in enumerate(PROMPTS)
    ]
    with platform.admin() as admin:
        admin.promote(aid, v1)
        admin.put_regression_set(aid, "\n".join(json.dumps(c) for c in cases))
        started = admin.start_evaluation(aid, v2)
        assert started["progress"]["total"] == 3 * len(PROMPTS)
        deadline = time.monotonic() + 900  # cold loads on CPU vLLM under a loaded machine
        ev = started
        while ev["status"] == "running":
            assert time.monotonic() < deadline, ev
            time.sleep(1)
            ev = admin.get_evaluation(aid, v2, started["id"])
        assert ev["status"] == "succeeded", (ev["error"], platform.log_tail())
        res = ev["result"]
        assert res["models"] == {
            "base": BASE,
            "current": f"{BASE}:{aid}@{v1}",
            "candidate": f"{BASE}:{aid}@{v2}",
        }
        for arm in ("base", "current", "candidate"):
            stats = res["arms"][arm]
            assert stats["errors"] == 0 and stats["pass_rate"] == 1.0, (arm, stats)
            assert stats["latency_ms"]["p50"] > 0
        # the adapters' weights differ: so do the greedy outputs of the three arms
        outputs = [
            tuple(c["arms"][a]["output"] for a in ("base", "current", "candidate")) for c in res["cases"]
        ]
        assert any(len(set(o)) == 3 for o in outputs), outputs
        assert res["pairwise"]["candidate_vs_current"]["exact_match_rate"] < 1.0
        assert res["pairwise"]["candidate_vs_base"]["exact_match_rate"] < 1.0
        assert any(c["changed_vs_current"] for c in res["cases"])
        assert ev["verdict"] == "passed"
        version = admin.get_version(aid, v2)
        assert version["quality_gate"] == "passed"
        assert version["quality_gate_details"]["evaluation_id"] == ev["id"]
