"""The gateway benchmark's summary over several rounds (benchmarks/gateway.py ``summarize``)."""

from __future__ import annotations

from typing import Any

from benchmarks.gateway import summarize


def _row(target: str, rnd: int, cpu: float, added: float | None, rps: float = 100.0) -> dict[str, Any]:
    return {
        "target": target,
        "stream": False,
        "concurrency": 32,
        "round": rnd,
        "rps": rps,
        "cpu_ms_per_req": cpu,
        "added_p50_ms": added,
    }


def test_ratios_are_taken_per_round_and_the_headline_is_their_median() -> None:
    rows = [
        _row("direct", 1, 0.1, None),
        _row("gateway", 1, 0.5, 1.0, rps=1000),
        _row("litellm", 1, 10.0, 30.0, rps=20),  # 20×, 30×
        _row("direct", 2, 0.1, None),
        _row("gateway", 2, 0.25, 2.0, rps=1000),
        _row("litellm", 2, 12.0, 20.0, rps=25),  # 48×, 10×
        _row("direct", 3, 0.1, None),
        _row("gateway", 3, 0.3, 1.5, rps=1000),
        _row("litellm", 3, 12.0, 30.0, rps=40),  # 40×, 20×
    ]
    s = summarize(rows, [32], 3)["c32"]
    assert s["cpu_litellm_over_gateway_rounds"] == [20.0, 48.0, 40.0]
    assert s["cpu_litellm_over_gateway"] == 40.0  # median of the rounds
    assert s["cpu_litellm_over_gateway_of_medians"] == 40.0  # 12.0 / 0.3
    assert s["added_p50_litellm_over_gateway_rounds"] == [30.0, 10.0, 20.0]
    assert s["added_p50_litellm_over_gateway"] == 20.0
    assert s["cpu_ms_per_req_gateway"] == 0.3
    assert s["throughput_ratio_gateway_over_litellm"] == 40.0  # 50, 40, 25


def test_one_round_without_litellm_keeps_the_gateway_figures_only() -> None:
    rows = [_row("direct", 1, 0.1, None), _row("gateway", 1, 0.4, 0.9)]
    s = summarize(rows, [32, 1], 1)
    assert s == {"c32": {"cpu_ms_per_req_gateway": 0.4}}
