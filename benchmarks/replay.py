"""Discrete-event replay of a request trace through a placement profile (virtual time).

Each replica is a ``simulator.engine.EngineModel`` — the same timing/scheduling model the
simulator's HTTP server runs in real time — driven here in virtual time by a discrete-event
loop, so a 10-minute trace replays in seconds. The router side is modelled as loraplane's
runtime does it: its own residency records (``loading`` → ``resident``) and in-flight counts per
replica and adapter updated from the events, one load at a time per (replica, adapter) with the
other requests waiting for it (singleflight), ``Decision.evict`` executed as is (the evictor's
answer is final), and scraped gauges (``num_requests_running/waiting``, ``kv_cache_usage``,
``lora_requests_info``) refreshed every ``scrape_interval_s`` seconds (GIE's default refresh is
50 ms).

A load costs ``load_overhead_s`` seconds on the router side (staging + sha256 + HTTP) and then
the engine's own ``add_lora`` cost (``load_fixed_s + bytes / load_bytes_per_s``, run inside the
engine loop, delaying its next step). A request that gets no replica (``Decision.replica`` None)
is retried every 100 ms, as a client would after a 503.

``Residency.requests`` is filled as the runtime fills it: requests routed to the adapter so far,
all replicas together, read when a replica's view is rebuilt.

**Prefix cache** (``ClusterConfig.prefix_cache_blocks`` > 0): every engine keeps vLLM's prefix
cache per ``lora_name`` (``simulator/prefix_cache.py``), and a request's prompt is a chain of
blocks: its adapter's shared system prompt (``TraceRequest.system_tokens``), then its session's
conversation so far (``session``; each turn extends the previous one), then its own tokens. The
router side keeps loraplane's approximate index (``router.prefix.PrefixIndex``: where it sent
each block) and passes ``PlacementRequest.prefix`` from it — what the default policy and the
llm-d-style prefix scorer read in production. ``prefix_source="engine"`` passes the engines' true
cached prefixes instead (the oracle row). ``prefill_tokens`` counts the prompt tokens computed.

**Tiers**: ``max_cpu_loras`` adapters stay in each engine's host cache; a registered adapter
beyond them is re-read from disk on its next use (``cpu_reloads`` / ``disk_rereads``).

``decision_us_*``: CPU time of ``profile.pick`` (this thread's; a busy machine still inflates it).
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.traces import TraceRequest
from router.placement import PlacementRequest, ReplicaView, Residency
from router.placement.types import Profile
from router.prefix import PrefixIndex
from simulator.engine import EngineModel, TimingParams
from simulator.prefix_cache import PrefixCache

RETRY_S = 0.1
MAX_RETRIES = 600  # a minute of 503s, then the request counts as failed


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    replicas: int = 4
    max_loras: int = 4  # GPU slots per replica (vLLM --max-loras)
    max_adapters: int = 16  # adapters kept registered per replica (= --max-cpu-loras)
    max_num_seqs: int = 256
    adapter_bytes: int = 32 * 1024 * 1024
    load_overhead_s: float = 0.1
    scrape_interval_s: float = 0.05
    max_cpu_loras: int = 0  # adapters kept in host memory (vLLM --max-cpu-loras); 0: = max_adapters
    prefix_cache_blocks: int = 0  # per engine, blocks of ``block_tokens``; 0: no prefix caching
    block_tokens: int = 16

    @property
    def cpu_loras(self) -> int:
        return max(self.max_loras, self.max_cpu_loras or self.max_adapters)

    def timing(self) -> TimingParams:
        return TimingParams(
            max_loras=self.max_loras, max_cpu_loras=self.cpu_loras, max_num_seqs=self.max_num_seqs
        )


class _PeekCache(PrefixCache):
    """A ``PrefixCache`` that can also be read without touching it (the oracle's view)."""

    def peek(self, blocks: list[int], prompt_tokens: int) -> int:
        n = 0
        for h in blocks:
            if h not in self._blocks:
                break
            n += 1
        return min(n * self.block_tokens, max(0, prompt_tokens - 1))


def prompt_blocks(req: TraceRequest, i: int, block_tokens: int = 16) -> list[int]:
    """Chained block hashes of request ``i``'s prompt, seeded with its adapter (vLLM's key):
    the adapter's system prompt first, then its session (or, without one, its own) tokens."""
    if not req.system_tokens and not req.session:
        return []
    h = hash(("seed", req.adapter))
    sys_blocks = req.system_tokens // block_tokens
    own = req.session or f"#{i}"
    out: list[int] = []
    for k in range(req.prompt_tokens // block_tokens):
        h = hash((h, "sys", k) if k < sys_blocks else (h, own, k))
        out.append(h)
    return out


class _Rec:
    """The router's residency record of one adapter on one replica."""

    __slots__ = ("inflight", "last_used", "name", "state", "waiters")

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.state = "loading"
        self.last_used = now
        self.inflight = 0
        self.waiters: list[int] = []


class _Replica:
    __slots__ = ("engine", "inflight", "residents", "scraped", "url", "view")

    def __init__(self, url: str, timing: TimingParams, prefix_blocks: int, block_tokens: int) -> None:
        self.url = url
        self.engine = EngineModel(timing)
        if prefix_blocks > 0:
            self.engine.prefix_cache = _PeekCache(prefix_blocks, block_tokens)
        self.residents: dict[str, _Rec] = {}
        self.inflight = 0
        self.scraped: tuple[int, int, float, tuple[str, ...]] = (0, 0, 0.0, ())
        self.view: ReplicaView | None = None  # cached snapshot, None when stale


@dataclass
class RunResult:
    profile: str
    requests: int
    completed: int
    failed: int
    distinct_adapters: int
    loads: int
    replications: int
    evictions: int
    engine_disk_loads: int
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    worst_adapter_p99_s: float
    throughput_rps: float
    throughput_tok_s: float
    wall_s: float
    decisions: dict[str, int] = field(default_factory=dict)
    loads_vs_min: float = math.nan  # loads / Belady's MIN of the trace (set by main)
    cpu_reloads: int = 0  # adapter copies host memory → GPU slot (the CPU tier)
    disk_rereads: int = 0  # registered adapters re-read from disk (beyond max_cpu_loras)
    prompt_tokens: int = 0  # prompt tokens of the completed requests
    prefill_tokens: int = 0  # of them computed (prefix-cache hits excluded)
    churn: int = 0  # registration changes: loads + evictions
    jain_ttft: float = math.nan  # Jain's index over per-tenant (else per-adapter) mean TTFT
    tenant_p99_s: dict[str, float] = field(default_factory=dict)  # heavy vs light tenants (if any)
    decision_us_mean: float = math.nan
    decision_us_p99: float = math.nan


def _pct(sorted_vals: Sequence[float], q: float) -> float:
    if not sorted_vals:
        return math.nan
    k = min(len(sorted_vals) - 1, max(0, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[k]


def jain(values: list[float]) -> float:
    """Jain's fairness index: (Σx)² / (n Σx²), 1 when all equal, 1/n at worst."""
    if not values:
        return math.nan
    sq = sum(x * x for x in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq > 0 else 1.0


def replay(
    trace: list[TraceRequest],
    profile: Profile,
    cfg: ClusterConfig,
    min_adapter_requests: int = 5,
    prefix_source: str = "index",
) -> RunResult:
    """Replay ``trace`` through ``profile`` on a simulated cluster; virtual time, deterministic
    (apart from the ``decision_us_*`` timings). ``prefix_source``: ``index`` (the router's
    approximate prefix index) or ``engine`` (the engines' true prefix caches: the oracle)."""
    if prefix_source not in ("index", "engine"):
        raise ValueError("prefix_source must be 'index' or 'engine'")
    started = time.perf_counter()
    timing = cfg.timing()
    reps = [
        _Replica(f"http://r{i}", timing, cfg.prefix_cache_blocks, cfg.block_tokens)
        for i in range(cfg.replicas)
    ]
    caching = cfg.prefix_cache_blocks > 0
    index = PrefixIndex(block_chars=cfg.block_tokens * 4, capacity=1_000_000)
    blocks_of: dict[int, list[int]] = {}
    pick_ns: list[int] = []
    by_url = {r.url: r for r in reps}
    n = len(trace)
    arrival = [r.t for r in trace]
    ttft: list[float | None] = [None] * n
    placed_on: list[_Replica | None] = [None] * n
    attempts = [0] * n
    failed = 0
    completed = 0
    tokens = 0
    last_finish = 0.0
    loads = replications = evictions = 0
    outcomes: dict[str, int] = defaultdict(int)
    asked: dict[str, int] = defaultdict(int)  # requests per adapter so far (Residency.requests)
    heap: list[tuple[float, int, str, Any]] = []
    seq = 0

    def push(t: float, kind: str, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, payload))

    def view_of(rep: _Replica) -> ReplicaView:
        v = rep.view
        if v is None:
            running, waiting, kv, info = rep.scraped
            v = rep.view = ReplicaView(
                url=rep.url,
                pool="bench",
                healthy=True,
                max_loras=cfg.max_loras,
                max_adapters=cfg.max_adapters,
                max_cpu_loras=cfg.cpu_loras,
                residents={
                    name: Residency(
                        lora_name=name,
                        state=rec.state,  # type: ignore[arg-type]
                        adapter_id=name,
                        last_used=rec.last_used,
                        inflight=rec.inflight,
                        size_bytes=cfg.adapter_bytes,
                        requests=asked[name],
                    )
                    for name, rec in rep.residents.items()
                },
                inflight=rep.inflight,
                running=running,
                waiting=waiting,
                kv_cache_usage=kv,
                lora_running=info,
                lora_waiting=info,
                max_num_seqs=cfg.max_num_seqs,
            )
        return v

    def dispatch(rep: _Replica, i: int, now: float) -> None:
        req = trace[i]
        blocks = blocks_of.pop(i, ())
        rep.engine.add_request(str(i), req.adapter, req.prompt_tokens, req.output_tokens, now, prefix=blocks)

    def cached(i: int, now: float) -> dict[str, int]:
        if not caching:
            return {}
        blocks = blocks_of.get(i)
        if blocks is None:
            blocks = blocks_of[i] = prompt_blocks(trace[i], i, cfg.block_tokens)
        if not blocks:
            return {}
        if prefix_source == "index":  # sorted: set order must not leak into tie-breaks
            return dict(sorted(index.match(blocks, now).items()))
        out = {}
        for r in reps:
            pc = r.engine.prefix_cache
            if isinstance(pc, _PeekCache) and (n := pc.peek(blocks, trace[i].prompt_tokens)) > 0:
                out[r.url] = n
        return out

    def route(i: int, now: float) -> None:
        nonlocal failed, loads, replications, evictions
        req = trace[i]
        preq = PlacementRequest(
            lora_name=req.adapter,
            adapter_id=req.adapter,
            size_bytes=cfg.adapter_bytes,
            prompt_tokens=req.prompt_tokens,
            max_tokens=req.output_tokens,
            prefix=cached(i, now),
        )
        views = [view_of(r) for r in reps]
        t0 = time.thread_time_ns()  # CPU time: less inflated by other processes
        d = profile.pick(preq, views, now)
        pick_ns.append(time.thread_time_ns() - t0)
        if d.replica is None:
            attempts[i] += 1
            if attempts[i] >= MAX_RETRIES:
                failed += 1
            else:
                push(now + RETRY_S, "arrive", i)
            outcomes["no-capacity"] += 1
            return
        rep = by_url[d.replica]
        outcomes[d.action] += 1
        if caching and blocks_of.get(i):
            index.record(blocks_of[i], rep.url, now)
        if req.adapter is not None:
            asked[req.adapter] += 1
        for victim in d.evict:
            rec = rep.residents.pop(victim)
            if rec.inflight or rec.state != "resident":
                raise AssertionError(f"{profile.name} evicted {victim} with {rec.inflight} in flight")
            rep.engine.unregister_adapter(victim)
            evictions += 1
        placed_on[i] = rep
        rep.inflight += 1
        rep.view = None
        if req.adapter is None:
            dispatch(rep, i, now)
            return
        found = rep.residents.get(req.adapter)
        if found is None:
            rec = rep.residents[req.adapter] = _Rec(req.adapter, now)
            loads += 1
            if d.action == "replicate":
                replications += 1
            push(now + cfg.load_overhead_s, "register", (rep, req.adapter))
        else:
            rec = found
        rec.inflight += 1
        rec.last_used = now
        if rec.state == "resident":
            dispatch(rep, i, now)
        else:
            rec.waiters.append(i)

    def scrape() -> None:
        for rep in reps:
            e = rep.engine
            info = tuple(e.lora_info_adapters)
            rep.scraped = (e.running, e.waiting, e.kv_cache_usage, info)
            rep.view = None

    next_arrival = 0
    next_scrape = 0.0
    guard = 0
    limit = 200 * n + 10_000_000
    while True:
        guard += 1
        if guard > limit:
            raise RuntimeError("replay did not terminate")
        t_arr = arrival[next_arrival] if next_arrival < n else math.inf
        t_heap = heap[0][0] if heap else math.inf
        t_eng = math.inf
        tes = [rep.engine.next_event_time() for rep in reps]
        for te in tes:
            if te is not None and te < t_eng:
                t_eng = te
        now = min(t_arr, t_heap, t_eng)
        if now == math.inf:
            break
        if next_scrape <= now:
            scrape()
            next_scrape = now + cfg.scrape_interval_s
        for rep, te in zip(reps, tes, strict=True):
            if te is None or te > now:
                continue  # nothing due: add_request/register_adapter catch the engine up themselves
            for ev in rep.engine.advance(now):
                i = int(ev.req_id)
                if ev.kind == "first_token":
                    ttft[i] = ev.time - arrival[i]
                elif ev.kind == "finished":
                    completed += 1
                    tokens += ev.index
                    last_finish = max(last_finish, ev.time)
                    rep.inflight -= 1
                    name = trace[i].adapter
                    if name is not None:
                        rep.residents[name].inflight -= 1
                    rep.view = None
        while heap and heap[0][0] <= now:
            t, _, kind, payload = heapq.heappop(heap)
            if kind == "arrive":
                route(payload, t)
            elif kind == "register":
                rep, name = payload
                ready = rep.engine.register_adapter(name, cfg.adapter_bytes, t).ready_at
                push(ready, "ready", (rep, name))
            elif kind == "ready":
                rep, name = payload
                rec = rep.residents[name]
                rec.state = "resident"
                rep.view = None
                for i in rec.waiters:
                    dispatch(rep, i, t)
                rec.waiters = []
        if t_arr <= now:
            route(next_arrival, t_arr)
            next_arrival += 1

    done = [x for x in ttft if x is not None]
    done.sort()
    per_adapter: dict[str, list[float]] = defaultdict(list)
    for i, x in enumerate(ttft):
        name = trace[i].adapter
        if x is not None and name is not None:
            per_adapter[name].append(x)
    worst = 0.0
    for vals in per_adapter.values():
        if len(vals) >= min_adapter_requests:
            vals.sort()
            worst = max(worst, _pct(vals, 0.99))
    per_tenant: dict[str, list[float]] = defaultdict(list)
    for i, x in enumerate(ttft):
        key = trace[i].tenant or trace[i].adapter
        if x is not None and key is not None:
            per_tenant[key].append(x)
    groups = [v for v in per_tenant.values() if len(v) >= min_adapter_requests]
    tenant_p99: dict[str, float] = {}
    if any(r.tenant for r in trace):
        light = sorted(x for k, v in per_tenant.items() if k != "heavy" for x in v)
        tenant_p99 = {"heavy": _pct(sorted(per_tenant.get("heavy", [])), 0.99), "light": _pct(light, 0.99)}
        worst_light = max((_pct(sorted(v), 0.99) for k, v in per_tenant.items() if k != "heavy"), default=0.0)
        tenant_p99["worst_light"] = worst_light
    pick_ns.sort()
    prompt_done = sum(trace[i].prompt_tokens for i, x in enumerate(ttft) if x is not None)
    makespan = max(last_finish - (arrival[0] if n else 0.0), 1e-9)
    return RunResult(
        profile=profile.name,
        requests=n,
        completed=completed,
        failed=failed,
        distinct_adapters=len({r.adapter for r in trace if r.adapter is not None}),
        loads=loads,
        replications=replications,
        evictions=evictions,
        engine_disk_loads=sum(r.engine.total_disk_loads for r in reps),
        ttft_p50_s=_pct(done, 0.50),
        ttft_p99_s=_pct(done, 0.99),
        ttft_mean_s=statistics.fmean(done) if done else math.nan,
        worst_adapter_p99_s=worst,
        throughput_rps=completed / makespan,
        throughput_tok_s=tokens / makespan,
        wall_s=time.perf_counter() - started,
        decisions=dict(outcomes),
        cpu_reloads=sum(r.engine.total_cpu_reloads for r in reps),
        disk_rereads=sum(r.engine.total_disk_loads for r in reps) - loads,
        prompt_tokens=prompt_done,
        prefill_tokens=sum(r.engine.prefill_tokens for r in reps),
        churn=loads + evictions,
        jain_ttft=jain([statistics.fmean(v) for v in groups]),
        tenant_p99_s=tenant_p99,
        decision_us_mean=statistics.fmean(pick_ns) / 1000 if pick_ns else math.nan,
        decision_us_p99=_pct(pick_ns, 0.99) / 1000 if pick_ns else math.nan,
    )
