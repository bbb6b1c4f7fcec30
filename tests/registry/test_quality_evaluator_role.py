"""`loraplane serve --role evaluator` (SPEC §16) on real processes: PostgreSQL, Redis, S3, two
simulator replicas with simulated behaviours, `serve --role registry` with
LORAPLANE_EVAL_IN_PROCESS=false (it only records runs), one `serve --role gateway`, and two
evaluator processes that claim the runs — each run exactly once — and send them through the
gateway."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import pytest

from kit import localservices as ls
from kit.procs import ManagedProcess, log_ready
from tests.gateway.gw_platform import Platform, run_platform
from tests.registry.quality_support import json_cases, jsonl

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster"), pytest.mark.timeout(600)]

BEHAVIOURS = {"shop@v1-*": {"output": "json"}, "shop@v2-*": {"output": "broken_json"}}


@pytest.fixture(scope="module")
def platform(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with run_platform(
        s3_server,
        redis_url,
        gateways=1,
        sim_args=("--zero-latency", "--behaviours", json.dumps(BEHAVIOURS)),
        env={"LORAPLANE_EVAL_IN_PROCESS": "false"},
    ) as p:
        yield p


def test_evaluator_processes_claim_each_run_once(platform: Platform) -> None:
    p = platform
    p.adapter("shop", versions=2)
    env = dict(p.procs[0].env or {})
    env["LORAPLANE_EVAL_GATEWAY_URL"] = p.gateway_urls[0]
    evaluators = []
    for i in range(2):
        log = p.workdir / f"evaluator-{i}.log"
        argv = [sys.executable, "-m", "loraplane.cli", "serve", "--role", "evaluator"]
        evaluators.append(ManagedProcess(argv, env=env, log_path=log, name=f"evaluator-{i}").start())
    try:
        for e in evaluators:
            e.wait_ready(log_ready(e.log_path, "evaluator "), 90)
        p.admin.put_regression_set("shop", jsonl(json_cases(6)))
        ids = {v: p.admin.start_evaluation("shop", v)["id"] for v in ("v1", "v2")}
        deadline = time.monotonic() + 120
        done: dict[str, dict[str, object]] = {}
        while len(done) < 2:
            assert time.monotonic() < deadline, done
            for v, eid in ids.items():
                ev = p.admin.get_evaluation("shop", v, eid)
                if ev["status"] != "running":
                    done[v] = ev
            time.sleep(0.3)
        good, bad = (
            p.admin.get_evaluation("shop", "v1", ids["v1"]),
            p.admin.get_evaluation("shop", "v2", ids["v2"]),
        )
        assert good["status"] == "succeeded" and good["verdict"] == "passed", good["error"]
        assert good["result"]["models"]["current"] is None  # v1 is the active version itself
        assert bad["status"] == "succeeded" and bad["verdict"] == "failed", bad["error"]
        assert bad["result"]["arms"]["candidate"]["format_error_rate"] == 1.0
        assert bad["result"]["arms"]["current"]["pass_rate"] == 1.0
        assert p.admin.get_version("shop", "v2")["quality_gate"] == "failed"
        # one key per run: each run was claimed by exactly one evaluator
        issued = p.admin.list_audit(action="key.issued", subject_id="loraplane-evaluator")
        assert len(issued) == 2
    finally:
        for e in evaluators:
            e.stop()
