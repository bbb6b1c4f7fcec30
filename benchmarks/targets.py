"""Issue 28's targets, checked on the routing benchmark's runs (``benchmarks/routing.py``).

- **vs anchors**: default loads ≤ 0.8× and p99 TTFT ≤ 0.8× the best of the Dynamo-style and
  llm-d-style baselines (the better of the two on each measure), every trace;
- **vs the bound**: loads ≤ 1.3× Belady's MIN on skewed traces (popularity α ≥ 0.8,
  ``workloads.ALPHA``); p99 TTFT ≤ 0.4× round-robin's, every trace;
- **prefix**: on the shared-prefix trace, prefill tokens computed ≤ 1.1× the prefix oracle's;
- **scaling**: placement decision time at 1,000 replicas ≤ 2× its time at 100 (the router path's
  first-pass p99, measured as ``benchmarks/placement.py`` does, with fewer decisions).
"""

from __future__ import annotations

from typing import Any

from benchmarks import workloads as wl

ANCHORS = ("dynamo", "llm-d")


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def check_targets(runs: list[dict[str, Any]], scaling: dict[str, Any] | None) -> dict[str, Any]:
    lines: list[str] = []
    per: dict[str, dict[str, Any]] = {}
    for run in runs:
        name = run["workload"]
        res = {r["profile"]: r for r in run["results"]}
        d = res.get("default")
        if d is None:
            continue
        t: dict[str, Any] = {}
        anchors = [res[a] for a in ANCHORS if a in res]
        if anchors:
            bl = min(anchors, key=lambda r: r["loads"])
            bp = min(anchors, key=lambda r: r["ttft_p99_s"])
            t["loads_vs_anchor"] = d["loads"] / max(1, bl["loads"])
            t["p99_vs_anchor"] = d["ttft_p99_s"] / bp["ttft_p99_s"] if bp["ttft_p99_s"] else float("inf")
            t["anchor_loads_met"] = t["loads_vs_anchor"] <= 0.8
            t["anchor_p99_met"] = t["p99_vs_anchor"] <= 0.8
            lines.append(
                f"{name:<14} loads {t['loads_vs_anchor']:.2f}x best anchor ({d['loads']} vs {bl['profile']} "
                f"{bl['loads']}; <= 0.8: {_mark(t['anchor_loads_met'])}), p99 {t['p99_vs_anchor']:.2f}x "
                f"({d['ttft_p99_s'] * 1000:.0f} vs {bp['profile']} {bp['ttft_p99_s'] * 1000:.0f} ms; "
                f"<= 0.8: {_mark(t['anchor_p99_met'])})"
            )
        if wl.ALPHA.get(name, 0.0) >= 0.8:
            t["loads_vs_min"] = d["loads_vs_min"]
            t["min_met"] = d["loads_vs_min"] <= 1.3
            lines.append(
                f"{name:<14} loads {d['loads_vs_min']:.2f}x Belady MIN "
                f"(skewed, <= 1.3: {_mark(t['min_met'])})"
            )
        rr = res.get("round-robin")
        if rr is not None and rr["ttft_p99_s"] > 0:
            t["p99_vs_rr"] = d["ttft_p99_s"] / rr["ttft_p99_s"]
            t["rr_met"] = t["p99_vs_rr"] <= 0.4
            lines.append(
                f"{name:<14} p99 {t['p99_vs_rr']:.2f}x round-robin's ({d['ttft_p99_s'] * 1000:.0f} vs "
                f"{rr['ttft_p99_s'] * 1000:.0f} ms; <= 0.4: {_mark(t['rr_met'])})"
            )
        oracle = res.get("prefix-oracle")
        if oracle is not None and oracle["prefill_tokens"] > 0:
            t["prefill_vs_oracle"] = d["prefill_tokens"] / oracle["prefill_tokens"]
            t["prefix_met"] = t["prefill_vs_oracle"] <= 1.1
            lines.append(
                f"{name:<14} prefill {t['prefill_vs_oracle']:.2f}x the oracle's ({d['prefill_tokens']} vs "
                f"{oracle['prefill_tokens']} tokens; <= 1.1: {_mark(t['prefix_met'])})"
            )
        per[name] = t
    out: dict[str, Any] = {"per_trace": per, "lines": lines}
    if scaling is not None:
        ok = scaling["ratio"] <= 2.0
        out["scaling_met"] = ok
        lines.append(
            f"decision time p99 (router path, first pass) {scaling['big']['replicas']} vs 100 replicas: "
            f"{scaling['ratio']:.2f}x ({scaling['big']['raw_first_pass_p99_us']:.0f} vs "
            f"{scaling['small']['raw_first_pass_p99_us']:.0f} µs; <= 2: {_mark(ok)})"
        )
    keys = ("anchor_loads_met", "anchor_p99_met", "min_met", "rr_met", "prefix_met")
    counts = {
        k: [sum(1 for t in per.values() if t.get(k)), sum(1 for t in per.values() if k in t)] for k in keys
    }
    out["met_counts"] = counts
    lines.append(
        "met / traces: "
        + ", ".join(f"{k.removesuffix('_met')} {m}/{n}" for k, (m, n) in counts.items())
        + (f", scaling {'1/1' if out.get('scaling_met') else '0/1'}" if scaling is not None else "")
    )
    return out


def decision_scaling(decisions: int = 3000, repeat: int = 2, seed: int = 0) -> dict[str, Any]:
    """The default policy's router-path decision time at 100 and 1,000 replicas (10,000 and
    100,000 adapters, ``max_adapters`` 32, ``max_loras`` 8: ``benchmarks/placement.py``'s set-up)."""
    from benchmarks.placement import bench_profile

    small = bench_profile("default", decisions, seed, 100, 10_000, 32, 8, repeat, router_path=True)
    big = bench_profile("default", decisions, seed, 1000, 100_000, 32, 8, repeat, router_path=True)
    return {
        "small": small,
        "big": big,
        "ratio": big["raw_first_pass_p99_us"] / small["raw_first_pass_p99_us"],
        "ratio_fastest": big["p99_us"] / small["p99_us"],
    }
