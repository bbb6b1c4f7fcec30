"""Evaluations end to end (SPEC §16) on `loraplane up` with simulated behaviours: every case goes
through the real gateway → router → simulated replica for the base model, the active version and
the candidate. A candidate whose answers are valid JSON passes its gate; one whose JSON is broken
(simulator ``output: broken_json`` for that version's lora names) fails it with the right numbers
and cannot be promoted."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.admin_client import AdminAPIError
from tests.registry.quality_support import json_cases, jsonl, platform, push_versions, wait_evaluation

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N = 9  # cases; every third has a regex check too
BEHAVIOURS = {
    "shop@v1-*": {"output": "json"},
    "shop@v2-*": {"output": "json"},
    "shop@v3-*": {"output": "broken_json"},
}


def test_good_candidate_passes_bad_candidate_fails(tmp_path: Path) -> None:
    with platform(tmp_path / "data", BEHAVIOURS) as p, p.admin() as admin:
        v1, v2, v3 = push_versions(admin, "shop", tmp_path, 3)
        admin.promote("shop", v1)
        stored = admin.put_regression_set("shop", jsonl(json_cases(N)))
        assert stored["version"] == 1 and stored["case_count"] == N
        admin.put_quality_policy("shop", {"min_pass_rate": 0.95, "max_format_error_rate": 0.0})

        # -- a good candidate: JSON like the active version --------------------------------------
        started = admin.start_evaluation("shop", v2)
        assert started["status"] == "running" and started["progress"]["total"] == 3 * N
        good = wait_evaluation(admin, "shop", v2, started["id"])
        assert good["status"] == "succeeded", good["error"]
        assert good["verdict"] == "passed" and good["progress"]["done"] == 3 * N
        res = good["result"]
        assert res["models"] == {
            "base": "demo-base",
            "current": f"demo-base:shop@{v1}",
            "candidate": f"demo-base:shop@{v2}",
        }
        cand, cur, base = res["arms"]["candidate"], res["arms"]["current"], res["arms"]["base"]
        assert cand["pass_rate"] == 1.0 and cand["format_error_rate"] == 0.0 and cand["errors"] == 0
        assert cand["pass_rate_by_check"] == {
            "json_schema": 1.0,
            "max_chars": 1.0,
            "refusal": 1.0,
            "regex": 1.0,
        }
        assert cur["pass_rate"] == 1.0 and cur["refusal_rate"] == 0.0
        # the bare base model answers plain text: every JSON check fails there
        assert base["pass_rate"] == 0.0 and base["format_error_rate"] == 1.0
        assert base["pass_rate_by_check"]["json_schema"] == 0.0
        for arm in (cand, cur, base):
            assert arm["cases"] == N and arm["mean_output_chars"] > 0
            assert 0 < arm["latency_ms"]["p50"] <= arm["latency_ms"]["p99"]
        assert res["verdict"]["passed"] and res["verdict"]["regression_pp"] == 0.0
        assert res["pairwise"]["candidate_vs_base"]["exact_match_rate"] == 0.0
        assert res["pairwise"]["candidate_vs_current"]["cases"] == N
        case0 = res["cases"][0]
        assert case0["id"] == "case-00" and case0["arms"]["candidate"]["passed"]
        assert case0["arms"]["candidate"]["output"].startswith('{"answer": "')
        assert [c["type"] for c in case0["arms"]["base"]["checks"] if not c["passed"]] == [
            "json_schema",
            "regex",
        ]
        assert admin.get_version("shop", v2)["quality_gate"] == "passed"

        # -- a bad candidate: broken JSON ---------------------------------------------------------
        bad = wait_evaluation(admin, "shop", v3, admin.start_evaluation("shop", v3)["id"])
        assert bad["status"] == "succeeded" and bad["verdict"] == "failed"
        cand = bad["result"]["arms"]["candidate"]
        assert cand["pass_rate"] == 0.0 and cand["format_error_rate"] == 1.0
        assert cand["pass_rate_by_check"]["json_schema"] == 0.0
        assert cand["pass_rate_by_check"]["max_chars"] == 1.0  # only the format broke
        verdict = bad["result"]["verdict"]
        assert verdict["regression_pp"] == 100.0 and len(verdict["reasons"]) == 3
        assert all(c["changed_vs_current"] for c in bad["result"]["cases"])
        version = admin.get_version("shop", v3)
        assert version["quality_gate"] == "failed"
        assert version["quality_gate_details"]["evaluation_id"] == bad["id"]
        with pytest.raises(AdminAPIError) as refused:
            admin.promote("shop", v3)
        assert refused.value.status == 409 and refused.value.code == "quality_gate_failed"

        # the gate changes are the evaluator's, with the evaluation id
        events = admin.list_audit(action="version.quality_gate", subject_id="shop")
        assert [
            (e["actor"], e["details"]["to"], e["details"]["details"]["evaluation_id"]) for e in events
        ] == [
            ("evaluator", "passed", good["id"]),
            ("evaluator", "failed", bad["id"]),
        ]
        listed = admin.list_evaluations("shop")
        assert [e["id"] for e in listed] == [bad["id"], good["id"]] and "result" not in listed[0]
        # the evaluator's keys were revoked at the end of each run
        keys = admin.list_audit(action="key.revoked", subject_id="loraplane-evaluator")
        assert len(keys) == 2 and {e["actor"] for e in keys} == {"evaluator"}
