"""``benchmarks/autoscaling.py`` on a short day: the desired replicas the controller computes
from its forecast follow the replicas the true in-flight demand needs (issue 28, item 5)."""

from __future__ import annotations

import argparse

from benchmarks.autoscaling import run


def test_desired_replicas_follow_the_need_of_a_diurnal_day() -> None:
    args = argparse.Namespace(
        adapters=100, rate=20.0, duration=240.0, tick=3.0, replicas=4, max_num_seqs=32, max_loras=8,
        max_adapters=32, prefill_s=0.05, decode_s=0.02, seed=1,
    )  # fmt: skip
    out = run(args)
    s = out["summary"]
    assert s["ticks"] == 80 and len(out["hours"]) == 24
    assert s["corr_desired_need"] > 0.9, s  # it rises and falls with the day
    assert s["share_of_ticks_under_need"] < 0.1, s  # and seldom asks for less than is needed
    peak = max(out["hours"], key=lambda h: h["offered_rps"])
    trough = min(out["hours"], key=lambda h: h["offered_rps"])
    assert peak["desired"] > 2 * trough["desired"], (peak, trough)
