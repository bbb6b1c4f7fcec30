"""As an operator: `loraplane adapters regression-set | quality-policy | eval --wait | evals |
eval-show` against `loraplane up` with a candidate whose JSON answers are broken (simulated
behaviours, SPEC §16). The CLI lists every problem of a bad set, shows a table per arm, the
cases that changed between the current version and the candidate side by side, the verdict, and
exits 3 when the verdict failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.cli_helpers import run_cli
from tests.registry.quality_support import json_cases, jsonl, platform, push_versions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BEHAVIOURS = {"shop@v1-*": {"output": "json"}, "shop@v2-*": {"output": "broken_json"}}


def test_regression_set_and_eval_from_the_cli(tmp_path: Path) -> None:
    with platform(tmp_path / "data", BEHAVIOURS) as p:
        env = {"LORAPLANE_ADMIN_URL": p.admin_url, "LORAPLANE_ADMIN_TOKEN": p.token}
        with p.admin() as admin:
            v1, v2 = push_versions(admin, "shop", tmp_path, 2)
            admin.promote("shop", v1)

        bad = tmp_path / "bad.jsonl"
        bad.write_text(
            json.dumps({"id": "a", "prompt": "x", "checks": [{"type": "regex", "pattern": "(("}]})
            + "\n"
            + json.dumps({"id": "a", "checks": [{"type": "max_chars", "n": -1}]})
            + "\n"
        )
        r = run_cli(["adapters", "regression-set", "shop", str(bad)], env)
        assert r.exit_code == 1
        assert "422 invalid_request: the regression set has 4 problem(s)" in r.stderr
        assert "  - line 1 (id 'a'): checks[0].pattern does not compile" in r.stderr
        assert "  - line 2: id 'a' is already used by line 1" in r.stderr

        cases = tmp_path / "cases.jsonl"
        cases.write_bytes(jsonl(json_cases(4)))
        r = run_cli(["adapters", "regression-set", "shop", str(cases)], env)
        assert r.exit_code == 0, r.stderr
        assert "shop regression set v1: 4 cases, sha256 " in r.stdout
        r = run_cli(["adapters", "quality-policy", "shop", "--max-format-error-rate", "0.1"], env)
        assert r.exit_code == 0, r.stderr
        assert '"max_format_error_rate":0.1' in r.stdout

        r = run_cli(["adapters", "eval", "shop", v2, "--wait"], env)
        assert r.exit_code == 3, (r.stdout, r.stderr)
        out = r.stdout
        assert "evaluation ev_" in out and f"of shop {v2}: succeeded" in out
        assert f"demo-base:shop@{v1}" in out and f"demo-base:shop@{v2}" in out  # the arms' models
        for row in ("pass rate", "json_schema", "format errors", "refusals", "latency p50 / p99 ms"):
            assert row in out, row
        assert "Cases whose output changed: current → candidate" in out
        assert "json_schema: output is not valid JSON" in out  # the candidate's side of the diff
        assert "case-00" in out and "case-03" in out
        assert f"verdict: failed — quality gate of {v2} set to failed" in out
        assert "format-error rate 100.00% is above max_format_error_rate 10.00%" in out

        r = run_cli(["adapters", "evals", "shop"], env)
        assert r.exit_code == 0 and "succeeded" in r.stdout and "failed" in r.stdout
        eid = out.split("evaluation ", 1)[1].split(" ", 1)[0]
        r = run_cli(["adapters", "eval-show", "shop", v2, eid, "--json"], env)
        assert r.exit_code == 3
        shown = json.loads(r.stdout)
        assert shown["id"] == eid and shown["result"]["arms"]["candidate"]["format_error_rate"] == 1.0

        # without --wait: the id at once; the run is then visible in the list
        r = run_cli(["adapters", "eval", "shop", v1, "--json"], env)
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout)["status"] == "running"
