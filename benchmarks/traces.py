"""Request traces for the routing benchmark: the S-LoRA recipe, or a JSON-lines file.

S-LoRA recipe (Sheng et al., 2023, §7): adapter popularity follows a power law (request share
of the adapter of rank ``k`` ∝ ``1 / k**alpha``), inter-arrival times are Gamma distributed
with mean ``1/rate`` and coefficient of variation ``cv`` (cv = 1 is Poisson; larger is
burstier), input and output lengths are uniform in ``[8, 512]``. Seedable.

A trace file holds one JSON object per line: ``{"t": seconds from start, "adapter": name,
"prompt_tokens": n, "output_tokens": n}`` (``adapter`` null → a base-model request), optionally
with ``"tenant"``, ``"system_tokens"`` and ``"session"`` (see ``TraceRequest``). The other
workloads of the routing benchmark (Zipf sweeps, diurnal, flash crowd, MMPP, shared prompts with
sessions, one heavy tenant) are in ``benchmarks/workloads.py``.

Run ``python -m benchmarks.traces --out trace.jsonl`` to write one.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, slots=True)
class TraceRequest:
    t: float
    adapter: str | None
    prompt_tokens: int
    output_tokens: int
    # Optional (``benchmarks/workloads.py``): the tenant that sent it; the leading tokens of the
    # prompt that are the adapter's shared system prompt; the conversation it belongs to (every
    # turn's prompt starts with the whole previous turn). Empty / 0: a prompt shared with nothing.
    tenant: str = ""
    system_tokens: int = 0
    session: str = ""


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """Knobs of the S-LoRA trace generator."""

    n_adapters: int = 500
    alpha: float = 1.0  # power-law exponent of adapter popularity (0 → uniform)
    rate: float = 6.0  # mean requests per second
    cv: float = 1.0  # coefficient of variation of inter-arrival times (burstiness)
    duration_s: float = 600.0
    min_len: int = 8
    max_len: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_adapters < 1 or self.rate <= 0 or self.cv <= 0 or self.duration_s <= 0:
            raise ValueError("n_adapters >= 1, rate > 0, cv > 0 and duration_s > 0 are required")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError("need 1 <= min_len <= max_len")


def adapter_name(i: int) -> str:
    return f"lora-{i:04d}"


def popularity(n_adapters: int, alpha: float) -> np.ndarray:
    """Request share of each adapter (rank 1 first): ∝ 1 / rank**alpha."""
    ranks = np.arange(1, n_adapters + 1, dtype=np.float64)
    w = ranks ** (-alpha)
    return w / w.sum()


def generate(spec: TraceSpec) -> list[TraceRequest]:
    """A trace following ``spec`` (same spec, same trace)."""
    rng = np.random.default_rng(spec.seed)
    # Gamma with shape k and scale θ: mean kθ = 1/rate, CV = 1/sqrt(k).
    shape = 1.0 / (spec.cv**2)
    scale = 1.0 / (spec.rate * shape)
    expected = int(spec.rate * spec.duration_s * 1.2) + 64
    times: list[float] = []
    t = 0.0
    for _ in range(100):  # bounded: each round draws more than the expected count
        gaps = rng.gamma(shape, scale, size=expected)
        for g in gaps:
            t += float(g)
            if t >= spec.duration_s:
                break
            times.append(t)
        if t >= spec.duration_s:
            break
    n = len(times)
    # Shuffle which adapter gets which popularity rank, so names carry no hint of it.
    perm = rng.permutation(spec.n_adapters)
    picks = rng.choice(spec.n_adapters, size=n, p=popularity(spec.n_adapters, spec.alpha))
    prompts = rng.integers(spec.min_len, spec.max_len + 1, size=n)
    outputs = rng.integers(spec.min_len, spec.max_len + 1, size=n)
    return [
        TraceRequest(times[i], adapter_name(int(perm[picks[i]])), int(prompts[i]), int(outputs[i]))
        for i in range(n)
    ]


def read_trace(path: Path) -> list[TraceRequest]:
    """Read a JSON-lines trace file (sorted by ``t`` on return)."""
    out: list[TraceRequest] = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                adapter = obj.get("adapter")
                out.append(
                    TraceRequest(
                        float(obj["t"]),
                        None if adapter is None else str(adapter),
                        int(obj["prompt_tokens"]),
                        int(obj["output_tokens"]),
                        str(obj.get("tenant", "")),
                        int(obj.get("system_tokens", 0)),
                        str(obj.get("session", "")),
                    )
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: bad trace line: {exc}") from None
    out.sort(key=lambda r: r.t)
    return out


def write_trace(path: Path, trace: list[TraceRequest]) -> None:
    with path.open("w") as fh:
        for r in trace:
            fh.write(json.dumps(asdict(r)) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--adapters", type=int, default=500)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--cv", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    spec = TraceSpec(a.adapters, a.alpha, a.rate, a.cv, a.duration, seed=a.seed)
    trace = generate(spec)
    write_trace(a.out, trace)
    print(f"wrote {len(trace)} requests to {a.out}")


if __name__ == "__main__":
    main()
