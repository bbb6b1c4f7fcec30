"""The conformance script passes against a real simulator process, and catches deviations."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from simulator.conformance import main, run_conformance
from simulator.procs import simulators

MakeAdapter = Callable[..., str]


def test_conformance_passes_against_the_simulator(make_adapter: MakeAdapter, tmp_path: Path) -> None:
    good, bad = make_adapter("good", seed=1), make_adapter("bad", rank=128)
    out = tmp_path / "report.json"
    with simulators(
        1, model="tinybase", extra_args=["--zero-latency", "--api-key", "k"], ready_timeout=120
    ) as procs:
        argv = [procs[0].url, "--model", "tinybase", "--adapter-dir", good, "--bad-rank-dir", bad]
        rc = main([*argv, "--api-key", "k", "--json", str(out)])
        report = json.loads(out.read_text())
        assert rc == 0, [c for c in report["checks"] if not c["ok"]]
        assert report["failed"] == 0 and report["passed"] >= 30
        # the key sets of every chat/completions body and stream chunk, and the error envelope
        keys = [c["name"] for c in report["checks"] if c["name"].startswith("keys: ")]
        assert len(keys) == 9 and any("continuous_usage_stats" in n for n in keys)
        # a wrong base name is caught by the script
        bad_rep = run_conformance(
            procs[0].url, model="wrong-name", adapter_dir=good, bad_rank_dir=bad, api_key="k"
        )
        failed = {c.name for c in bad_rep.failed}
        assert any(n.startswith("models: base card") for n in failed)
        assert any(n.startswith("metrics: model_name") for n in failed)


def test_conformance_catches_a_server_without_runtime_lora(make_adapter: MakeAdapter) -> None:
    good, bad = make_adapter("good", seed=1), make_adapter("bad", rank=128)
    with simulators(1, extra_args=["--zero-latency", "--no-allow-runtime-lora"], ready_timeout=120) as procs:
        report = run_conformance(procs[0].url, model="demo-base", adapter_dir=good, bad_rank_dir=bad)
    failed = {c.name for c in report.failed}
    assert "load: 200, exact plain-text success body, no Content-Type" in failed
    assert "health: GET /health is 200 with an empty body (no key needed)" not in failed
