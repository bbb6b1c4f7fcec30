"""The routing benchmark's workloads: named, seeded trace generators (issue 28, item 7).

Every generator is a pure function of its arguments (a NumPy ``Generator`` seeded with
``seed``): the same call gives the same trace. ``WORKLOADS`` maps each name the benchmark runs
to a call with the benchmark's defaults, scaled by ``duration_s``:

| name            | what it stresses                                                               |
|-----------------|--------------------------------------------------------------------------------|
| `zipf-0.3` …    | S-LoRA recipe (``traces.generate``), popularity ∝ 1/rank^α for α 0.3, 0.6,    |
| `zipf-1.2`      | 0.8, 1.2: near-uniform (every policy thrashes) to very skewed (a few hot ones) |
| `diurnal`       | the rate follows one sinusoidal day (trough → peak → trough, ×7 swing) and    |
|                 | each adapter's popularity has its own phase (tenants in other time zones)      |
| `flash-crowd`   | a Zipf background; for 15 % of the trace a few cold adapters get 3× the        |
|                 | background rate at once (a launch, a viral app)                                |
| `mmpp`          | a two-state Markov-modulated Poisson process (low 0.5×, high 3× the mean        |
|                 | rate); each high state sends half its requests to its own few adapters         |
| `shared-prefix` | per adapter a shared system prompt (512–2,048 tokens) and multi-turn sessions |
|                 | (each turn's prompt = the previous turn's prompt and answer + a new message):  |
|                 | where a request goes decides how much prefill the prefix cache saves           |
| `heavy-tenant`  | one tenant sends half the requests (bursty, CV 3) to its 4 adapters; 40 light |
|                 | tenants (5 adapters each) share the other half (per-tenant fairness)           |

Lengths: prompts and outputs uniform in [8, 512] unless a generator says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from benchmarks.traces import TraceRequest, TraceSpec, adapter_name, generate, popularity


def _lengths(rng: np.random.Generator, n: int, lo: int = 8, hi: int = 512) -> np.ndarray:
    return rng.integers(lo, hi + 1, size=n)


def _poisson_times(rng: np.random.Generator, rate: float, t0: float, t1: float) -> np.ndarray:
    """Poisson arrivals at ``rate`` in [t0, t1)."""
    if rate <= 0 or t1 <= t0:
        return np.zeros(0)
    n = int(rng.poisson(rate * (t1 - t0)))
    return np.sort(rng.uniform(t0, t1, size=n))


def _build(
    rng: np.random.Generator,
    times: np.ndarray,
    picks: np.ndarray,
    tenant_of: Callable[[int], str] | None = None,
) -> list[TraceRequest]:
    n = len(times)
    prompts = _lengths(rng, n)
    outputs = _lengths(rng, n)
    order = np.argsort(times, kind="stable")
    out = []
    for k in order:
        a = int(picks[k])
        tenant = tenant_of(a) if tenant_of is not None else ""
        out.append(TraceRequest(float(times[k]), adapter_name(a), int(prompts[k]), int(outputs[k]), tenant))
    return out


def zipf(
    alpha: float,
    *,
    n_adapters: int = 300,
    rate: float = 4.0,
    cv: float = 1.0,
    duration_s: float = 300.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """The S-LoRA recipe (``traces.generate``) at popularity exponent ``alpha``."""
    return generate(
        TraceSpec(n_adapters=n_adapters, alpha=alpha, rate=rate, cv=cv, duration_s=duration_s, seed=seed)
    )


def diurnal(
    *,
    n_adapters: int = 300,
    alpha: float = 1.0,
    rate: float = 4.0,
    swing: float = 0.75,
    duration_s: float = 300.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """One "day" in ``duration_s``: rate(t) = rate × (1 − swing·cos 2πt/D) (trough at both ends,
    peak in the middle: (1+swing)/(1−swing) = 7× at 0.75), drawn by thinning; adapter ``i``'s
    share is its Zipf weight × (1 + 0.8 sin(2πt/D + φᵢ)) with a random phase φᵢ."""
    rng = np.random.default_rng(seed)
    peak = rate * (1 + swing)
    cand = _poisson_times(rng, peak, 0.0, duration_s)
    keep = rng.uniform(0, peak, size=len(cand)) < rate * (1 - swing * np.cos(2 * math.pi * cand / duration_s))
    times = cand[keep]
    base = popularity(n_adapters, alpha)[rng.permutation(n_adapters)]
    phase = rng.uniform(0, 2 * math.pi, size=n_adapters)
    picks = np.empty(len(times), dtype=np.int64)
    bins = 24  # popularity re-drawn per "hour"
    edges = np.linspace(0, duration_s, bins + 1)
    for b in range(bins):
        sel = np.nonzero((times >= edges[b]) & (times < edges[b + 1]))[0]
        if not len(sel):
            continue
        mid = (edges[b] + edges[b + 1]) / 2
        w = base * (1 + 0.8 * np.sin(2 * math.pi * mid / duration_s + phase))
        picks[sel] = rng.choice(n_adapters, size=len(sel), p=w / w.sum())
    return _build(rng, times, picks)


def flash_crowd(
    *,
    n_adapters: int = 300,
    alpha: float = 0.8,
    rate: float = 4.0,
    crowd: int = 4,
    factor: float = 3.0,
    start: float = 0.4,
    length: float = 0.15,
    duration_s: float = 300.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Zipf(``alpha``) background at ``rate``; from ``start``·D for ``length``·D, ``crowd`` adapters
    from the coldest half get ``factor`` × ``rate`` more requests between them."""
    rng = np.random.default_rng(seed)
    p = popularity(n_adapters, alpha)
    perm = rng.permutation(n_adapters)  # rank → adapter index
    bg = _poisson_times(rng, rate, 0.0, duration_s)
    bg_picks = perm[rng.choice(n_adapters, size=len(bg), p=p)]
    cold = perm[rng.choice(np.arange(n_adapters // 2, n_adapters), size=crowd, replace=False)]
    t0 = start * duration_s
    fc = _poisson_times(rng, factor * rate, t0, t0 + length * duration_s)
    fc_picks = cold[rng.integers(0, crowd, size=len(fc))]
    return _build(rng, np.concatenate([bg, fc]), np.concatenate([bg_picks, fc_picks]))


def mmpp(
    *,
    n_adapters: int = 300,
    alpha: float = 0.8,
    rate: float = 4.0,
    low: float = 0.5,
    high: float = 3.0,
    mean_low_s: float = 40.0,
    mean_high_s: float = 10.0,
    burst_adapters: int = 6,
    duration_s: float = 300.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Two-state MMPP: exponential sojourns (``mean_low_s``, ``mean_high_s``) at ``low``×/``high``×
    ``rate``; a high state sends half its requests to ``burst_adapters`` adapters of its own
    (drawn uniformly), the rest Zipf(``alpha``) like the low state."""
    rng = np.random.default_rng(seed)
    p = popularity(n_adapters, alpha)
    perm = rng.permutation(n_adapters)
    times: list[np.ndarray] = []
    picks: list[np.ndarray] = []
    t, state = 0.0, 0
    while t < duration_s:
        dwell = float(rng.exponential(mean_high_s if state else mean_low_s))
        t1 = min(duration_s, t + dwell)
        ts = _poisson_times(rng, rate * (high if state else low), t, t1)
        pk = perm[rng.choice(n_adapters, size=len(ts), p=p)]
        if state:
            group = rng.choice(n_adapters, size=burst_adapters, replace=False)
            mask = rng.uniform(size=len(ts)) < 0.5
            pk[mask] = group[rng.integers(0, burst_adapters, size=int(mask.sum()))]
        times.append(ts)
        picks.append(pk)
        t, state = t1, 1 - state
    return _build(rng, np.concatenate(times), np.concatenate(picks))


def shared_prefix(
    *,
    n_adapters: int = 60,
    alpha: float = 0.8,
    rate: float = 4.0,
    mean_turns: float = 4.0,
    think_s: float = 8.0,
    max_prompt: int = 8192,
    duration_s: float = 300.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Sessions arrive Poisson at ``rate / mean_turns`` (so requests come at about ``rate``), each
    on a Zipf(``alpha``) adapter, with a geometric number of turns (mean ``mean_turns``) ``think_s``
    (exponential) apart. Adapter ``a`` has a system prompt of 512–2,048 tokens; turn ``k``'s prompt
    is that, every earlier message and answer, and a new message of 32–256 tokens (capped at
    ``max_prompt``); answers 32–256 tokens."""
    rng = np.random.default_rng(seed)
    p = popularity(n_adapters, alpha)
    perm = rng.permutation(n_adapters)
    system = rng.integers(512, 2049, size=n_adapters)
    starts = _poisson_times(rng, rate / mean_turns, 0.0, duration_s)
    out: list[TraceRequest] = []
    for s, t in enumerate(starts):
        a = int(perm[rng.choice(n_adapters, p=p)])
        turns = int(rng.geometric(1.0 / mean_turns))
        history = int(system[a])
        for _ in range(turns):
            if t >= duration_s:
                break
            msg = int(rng.integers(32, 257))
            answer = int(rng.integers(32, 257))
            prompt = min(max_prompt, history + msg)
            out.append(TraceRequest(float(t), adapter_name(a), prompt, answer, "", int(system[a]), f"s{s}"))
            history = prompt + answer
            t += float(rng.exponential(think_s))
    out.sort(key=lambda r: r.t)
    return out


def heavy_tenant(
    *,
    light_tenants: int = 40,
    per_tenant: int = 5,
    heavy_adapters: int = 4,
    rate: float = 4.0,
    heavy_share: float = 0.5,
    heavy_cv: float = 3.0,
    duration_s: float = 300.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Tenant ``heavy`` sends ``heavy_share`` of the requests, Gamma inter-arrivals with CV
    ``heavy_cv``, uniformly over its ``heavy_adapters`` adapters; ``light_tenants`` tenants of
    ``per_tenant`` adapters each send the rest (Poisson, equal shares, Zipf 0.8 within a tenant)."""
    rng = np.random.default_rng(seed)
    hv = generate(
        TraceSpec(
            n_adapters=heavy_adapters,
            alpha=0.0,
            rate=rate * heavy_share,
            cv=heavy_cv,
            duration_s=duration_s,
            seed=seed + 10_000,
        )
    )
    heavy = [replace(r, adapter=f"heavy-{r.adapter}", tenant="heavy") for r in hv]
    lt = _poisson_times(rng, rate * (1 - heavy_share), 0.0, duration_s)
    tenants = rng.integers(0, light_tenants, size=len(lt))
    within = rng.choice(per_tenant, size=len(lt), p=popularity(per_tenant, 0.8))
    light = _build(rng, lt, tenants * per_tenant + within, lambda a: f"t{a // per_tenant:02d}")
    return sorted(heavy + light, key=lambda r: r.t)


ZIPF_ALPHAS = (0.3, 0.6, 0.8, 1.2)
PREFIX = "shared-prefix"


WORKLOADS = (*(f"zipf-{a}" for a in ZIPF_ALPHAS), "diurnal", "flash-crowd", "mmpp", PREFIX, "heavy-tenant")
# Popularity exponent of each workload (the "skewed" target is for α ≥ 0.8); the heavy
# tenant's half is uniform over 4 adapters and the light half Zipf 0.8 within equal tenants.
ALPHA = {
    **{f"zipf-{a}": a for a in ZIPF_ALPHAS},
    "diurnal": 1.0,
    "flash-crowd": 0.8,
    "mmpp": 0.8,
    PREFIX: 0.8,
}


def make(name: str, *, duration_s: float = 300.0, seed: int = 0, rate: float = 4.0) -> list[TraceRequest]:
    """The workload ``name`` (one of ``WORKLOADS``), ``duration_s`` long, at ``rate`` req/s on average."""
    if name.startswith("zipf-"):
        try:
            alpha = float(name[5:])
        except ValueError:
            raise ValueError(f"bad workload {name!r}") from None
        return zipf(alpha, rate=rate, duration_s=duration_s, seed=seed)
    gens: dict[str, Callable[..., list[TraceRequest]]] = {
        "diurnal": diurnal,
        "flash-crowd": flash_crowd,
        "mmpp": mmpp,
        PREFIX: shared_prefix,
        "heavy-tenant": heavy_tenant,
    }
    gen = gens.get(name)
    if gen is None:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return gen(rate=rate, duration_s=duration_s, seed=seed)
