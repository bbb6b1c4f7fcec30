"""The pure timing / scheduling model of one vLLM engine (no I/O, time is injected).

Used in real time by the simulator's HTTP server (``simulator.runtime``) and in virtual time
by benchmarks (``benchmarks/routing.py``). Semantics follow vLLM's v1 scheduler
(``vllm/v1/core/sched/scheduler.py``) and LoRA managers, as vLLM 0.32 does.

API::

    params = TimingParams(max_loras=2, max_cpu_loras=4)      # or TimingParams.zero()
    eng = EngineModel(params)
    load = eng.register_adapter("a", size_bytes=20_000_000, now=0.0)   # -> AdapterLoad
    #   load.lora_id (vLLM's lora_int_id), load.ready_at (when the load call returns)
    eng.unregister_adapter("a")       # frontend registry only; cache residency persists
    eng.add_request("r1", lora="a", prompt_tokens=100, max_tokens=16, now=0.0,
                    want_tokens=False)
    events = eng.advance(now)         # EngineEvents up to ``now``, in time order
    eng.next_event_time()             # float | None: when to call advance() next
    eng.abort_request("r1", now)      # client went away
    # gauges: eng.running, eng.waiting, eng.waiting_deferred, eng.waiting_capacity,
    #         eng.running_loras, eng.waiting_loras, eng.lora_info_adapters, eng.kv_cache_usage

Model (all durations are multiplied by ``time_scale``):

- The engine runs in *steps*. A step schedules waiting requests (FIFO), then lasts
  ``decode_base_s + decode_per_seq_s * running + prefill_s_per_token * new_prompt_tokens``
  plus the adapter (re)load costs of that step. At the end of a step every running request
  gets one token; a request's first token therefore arrives at the end of the step that
  prefilled it.
- At most ``max_loras`` distinct adapters are in a batch. A waiting request whose adapter is
  not in the batch when the batch already holds ``max_loras`` adapters is *skipped, not
  rejected* (counted as waiting with reason ``deferred``); requests behind it are still
  scheduled. Base-model requests are never limited. Running requests are never preempted.
  ``max_num_seqs`` caps running requests and ``kv_cache_tokens`` caps their prompt tokens
  (those waits have reason ``capacity``).
- GPU slots (``max_loras``) and the CPU cache (``max_cpu_loras``, a superset) are both LRU.
  An adapter in the batch that is not in a GPU slot costs ``cpu_cache_reload_s`` (or the
  size-aware copy of ``tiers``, ``simulator/tiers.py``) if it is in the CPU cache, else a
  reload from disk: ``load_fixed_s + size_bytes / load_bytes_per_s``.
  The cost is added to that step, so the first token of that request (and of the whole
  batch) is later.
- With a ``prefix_cache`` (``simulator/prefix_cache.py``), a request's leading prompt blocks
  found there for its LoRA are not prefilled (``add_request(..., prefix=block hashes)``);
  ``prefill_tokens`` counts the prompt tokens computed.
- ``register_adapter`` is vLLM's ``add_lora``: it reads the adapter from disk into the CPU
  cache and a GPU slot (evicting LRU entries). It runs inside the engine loop, between
  steps, so it delays the next step; ``ready_at`` is when it completes.
- The frontend registry (name → lora_id) is separate from engine residency, as in vLLM:
  unregistering deletes the name only; the slot/cache entry stays until LRU eviction; a
  later register of the same name gets a new ``lora_id``. ``inplace=True`` keeps the id and
  forces a re-read.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from simulator.prefix_cache import PrefixCache
from simulator.tiers import TierCosts
from simulator.timing import (
    ALLOWED_LORA_RANKS,
    AdapterLoad,
    EngineEvent,
    EventKind,
    RequestTimes,
    TimingParams,
)

__all__ = [
    "ALLOWED_LORA_RANKS",
    "AdapterLoad",
    "EngineEvent",
    "EngineModel",
    "EventKind",
    "RequestTimes",
    "TimingParams",
]


@dataclass(slots=True)
class _Req:
    req_id: str
    lora: str | None
    lora_id: int
    prompt_tokens: int
    max_tokens: int
    arrival: float
    want_tokens: bool
    generated: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    cached: int = 0  # prompt tokens found in the prefix cache (not prefilled)


@dataclass(slots=True)
class _Residency:
    lora_id: int
    name: str
    size_bytes: int
    disk_loads: int = 0
    cpu_reloads: int = 0


@dataclass
class EngineModel:
    params: TimingParams
    _registry: dict[str, int] = field(default_factory=dict)
    _adapters: dict[int, _Residency] = field(default_factory=dict)
    _gpu: OrderedDict[int, None] = field(default_factory=OrderedDict)
    _cpu: OrderedDict[int, None] = field(default_factory=OrderedDict)
    _next_id: int = 1
    _waiting: list[_Req] = field(default_factory=list)
    _running: list[_Req] = field(default_factory=list)
    _reqs: dict[str, _Req] = field(default_factory=dict)
    _step_end: float | None = None
    _step_started: float = 0.0
    _free_at: float = 0.0  # engine busy (step or add_lora) until then
    _pending: list[EngineEvent] = field(default_factory=list)
    _step_prompt_tokens: int = 0
    steps: int = 0
    total_disk_loads: int = 0
    total_cpu_reloads: int = 0
    #: prompt tokens prefilled so far (prefix-cache hits excluded)
    prefill_tokens: int = 0
    #: vLLM's prefix cache (``simulator/prefix_cache.py``); None: no prefix caching
    prefix_cache: PrefixCache | None = None
    #: costs of the CPU → GPU tier (``simulator/tiers.py``); None: ``cpu_cache_reload_s``
    tiers: TierCosts | None = None
    #: called as ``on_iteration(tokens, steps)`` for ``steps`` engine steps that each processed
    #: ``tokens`` tokens (newly prefilled prompt tokens + one per running request), as vLLM's
    #: ``vllm:iteration_tokens_total``; None (the default) costs nothing
    on_iteration: Callable[[int, int], None] | None = None

    # ------------------------------------------------------------------ adapters
    def register_adapter(
        self, name: str, size_bytes: int, now: float, *, inplace: bool = False
    ) -> AdapterLoad:
        """vLLM ``add_lora``: register ``name`` and read it into the CPU cache and a GPU slot."""
        self._run(now, strict=True)
        lora_id = self._registry.get(name) if inplace else None
        if lora_id is None:
            lora_id = self._next_id
            self._next_id += 1
        else:
            self._evict(lora_id)
        self._registry[name] = lora_id
        res = self._adapters.get(lora_id)
        if res is None:
            res = self._adapters[lora_id] = _Residency(lora_id, name, int(size_bytes))
        res.size_bytes = int(size_bytes)
        cost = self.params.load_cost(res.size_bytes)
        res.disk_loads += 1
        self.total_disk_loads += 1
        self._cache_insert(lora_id, {r.lora_id for r in self._running if r.lora_id})
        start = max(now, self._free_at, self._step_end if self._step_end is not None else now)
        self._free_at = start + cost
        return AdapterLoad(lora_id, self._free_at, self._free_at - now)

    def unregister_adapter(self, name: str) -> bool:
        """Delete ``name`` from the frontend registry only (engine residency persists)."""
        return self._registry.pop(name, None) is not None

    def lora_id(self, name: str) -> int | None:
        return self._registry.get(name)

    def _evict(self, lora_id: int) -> None:
        self._gpu.pop(lora_id, None)
        self._cpu.pop(lora_id, None)

    def _cache_insert(self, lora_id: int, protected: set[int]) -> None:
        """Put ``lora_id`` at the MRU end of both caches, evicting LRU entries not in use."""
        self._cpu[lora_id] = None
        self._cpu.move_to_end(lora_id)
        while len(self._cpu) > self.params.cpu_loras:
            victim = next((k for k in self._cpu if k not in protected and k != lora_id), None)
            if victim is None:
                break
            del self._cpu[victim]
            self._gpu.pop(victim, None)
        self._gpu[lora_id] = None
        self._gpu.move_to_end(lora_id)
        while len(self._gpu) > self.params.max_loras:
            victim = next((k for k in self._gpu if k not in protected and k != lora_id), None)
            if victim is None:
                break
            del self._gpu[victim]

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        req_id: str,
        lora: str | None,
        prompt_tokens: int,
        max_tokens: int,
        now: float,
        *,
        want_tokens: bool = False,
        prefix: Sequence[int] = (),
    ) -> None:
        """Queue a request. ``lora`` must be registered (KeyError otherwise). ``prefix``: the
        prompt's chained block hashes, for the prefix cache (``prefix_cache.py``) if there is one."""
        self._run(now, strict=True)
        lora_id = 0
        if lora is not None:
            lora_id = self._registry[lora]
        if req_id in self._reqs:
            raise ValueError(f"duplicate request id {req_id}")
        req = _Req(
            req_id, lora, lora_id, max(0, int(prompt_tokens)), max(1, int(max_tokens)), now, want_tokens
        )
        if self.prefix_cache is not None and prefix:
            req.cached = self.prefix_cache.lookup(prefix, req.prompt_tokens)
            self.prefix_cache.insert(prefix)
        self._reqs[req_id] = req
        self._waiting.append(req)
        if self._step_end is None:
            self._free_at = max(self._free_at, now)

    def abort_request(self, req_id: str, now: float) -> bool:
        self._run(now, strict=True)
        req = self._reqs.pop(req_id, None)
        if req is None:
            return False
        if req in self._waiting:
            self._waiting.remove(req)
        elif req in self._running:
            self._running.remove(req)
        return True

    def request_times(self, req_id: str) -> RequestTimes | None:
        req = self._reqs.get(req_id)
        if req is None:
            return None
        return RequestTimes(req.arrival, req.scheduled_at, req.first_token_at, req.generated)

    # ------------------------------------------------------------------ time
    def advance(self, now: float) -> list[EngineEvent]:
        """Run the engine up to ``now``; return the events that happened, in time order."""
        self._run(now)
        out, self._pending = self._pending, []
        return out

    def next_event_time(self) -> float | None:
        if self._step_end is not None:
            return self._step_end
        if self._waiting or self._running:
            return self._free_at
        return None

    def _run(self, now: float, strict: bool = False) -> None:
        """Process steps up to ``now``; ``strict`` leaves what happens exactly at ``now`` for later
        (so requests added at the same instant join the same step)."""
        # Bounded: every iteration either completes a step or starts one.
        for _ in range(1_000_000):
            if self._step_end is not None:
                if self._step_end > now or (strict and self._step_end == now):
                    return
                self._finish_step()
                self._skip_steps(now, strict)
                continue
            if (
                not (self._waiting or self._running)
                or self._free_at > now
                or (strict and self._free_at == now)
            ):
                return
            if not self._start_step(self._free_at):
                return
        raise RuntimeError("engine did not settle")  # pragma: no cover

    def _blocked(self) -> bool:
        """True when no waiting request could be scheduled at the next step boundary."""
        p = self.params
        if not self._waiting or len(self._running) >= p.max_num_seqs:
            return True
        batch = {r.lora_id for r in self._running if r.lora_id}
        kv_used = sum(r.prompt_tokens + r.generated for r in self._running)
        for req in self._waiting:
            if self._running and kv_used + req.prompt_tokens > p.kv_cache_tokens:
                return True
            if req.lora_id and req.lora_id not in batch and len(batch) >= p.max_loras:
                continue
            return False
        return True

    def _skip_steps(self, now: float, strict: bool = False) -> None:
        """Macro-step: jump over decode-only steps that change nothing but token counts.

        Exact (same times and tokens as stepping one by one): it stops before any request
        finishes, before ``now``, and only when nothing waiting could be scheduled.
        """
        running = self._running
        if not running or self._step_end is not None or not self._blocked():
            return
        t = self._free_at
        k_min = min(r.max_tokens - r.generated for r in running)
        jumps = k_min - 1
        if jumps <= 0:
            return
        for r in running:
            if r.lora_id and r.lora_id not in self._gpu:
                return
        p = self.params
        d = (p.decode_base_s + p.decode_per_seq_s * len(running)) * p.time_scale
        if d > 0:
            fit = (now - t) / d
            jumps = min(jumps, math.ceil(fit) - 1 if strict else math.floor(fit))
        elif strict and t >= now:
            return
        if jumps <= 0:
            return
        streamers = [r for r in running if r.want_tokens]
        if streamers:
            ev = self._pending
            for i in range(1, jumps + 1):
                ti = t + i * d
                for r in streamers:
                    ev.append(EngineEvent("token", r.req_id, ti, r.generated + i))
        for r in running:
            r.generated += jumps
        if self.on_iteration is not None:
            self.on_iteration(len(running), jumps)
        if self._gpu:
            for r in running:
                if r.lora_id:
                    self._gpu.move_to_end(r.lora_id)
                    self._cpu.move_to_end(r.lora_id)
        self.steps += jumps
        self._free_at = t + jumps * d

    def _start_step(self, start: float) -> bool:
        p = self.params
        batch_loras = {r.lora_id for r in self._running if r.lora_id}
        kv_used = sum(r.prompt_tokens + r.generated for r in self._running)
        new_tokens = 0
        still_waiting: list[_Req] = []
        blocked = False
        for req in self._waiting:
            if blocked:
                still_waiting.append(req)
                continue
            if len(self._running) >= p.max_num_seqs or (
                self._running and kv_used + req.prompt_tokens > p.kv_cache_tokens
            ):
                blocked = True
                still_waiting.append(req)
                continue
            if req.lora_id and req.lora_id not in batch_loras and len(batch_loras) >= p.max_loras:
                still_waiting.append(req)  # deferred: skipped, not rejected
                continue
            if req.lora_id:
                batch_loras.add(req.lora_id)
            req.scheduled_at = start
            kv_used += req.prompt_tokens
            new_tokens += req.prompt_tokens - req.cached
            self._running.append(req)
        self._waiting = still_waiting
        if not self._running:
            return False
        load_s = 0.0
        for lid in batch_loras:
            if lid in self._gpu:
                self._gpu.move_to_end(lid)
                self._cpu.move_to_end(lid)
        for lid in batch_loras:
            if lid in self._gpu:
                continue
            res = self._adapters[lid]
            if lid in self._cpu:
                tiers = self.tiers
                load_s += (
                    p.cpu_cache_reload_s if tiers is None else tiers.cpu_to_gpu_s(res.name, res.size_bytes)
                ) * p.time_scale
                res.cpu_reloads += 1
                self.total_cpu_reloads += 1
            else:
                load_s += p.load_cost(res.size_bytes)
                res.disk_loads += 1
                self.total_disk_loads += 1
            self._cache_insert(lid, batch_loras)
        dur = (
            p.decode_base_s + p.decode_per_seq_s * len(self._running) + p.prefill_s_per_token * new_tokens
        ) * p.time_scale + load_s
        self._step_started = start
        self._step_end = start + dur
        self._step_prompt_tokens = new_tokens
        self.prefill_tokens += new_tokens
        self.steps += 1
        return True

    def _finish_step(self) -> None:
        t = self._step_end
        assert t is not None
        self._step_end = None
        self._free_at = max(self._free_at, t)
        keep: list[_Req] = []
        ev = self._pending
        if self.on_iteration is not None and self._running:
            self.on_iteration(self._step_prompt_tokens + len(self._running), 1)
        for req in self._running:
            req.generated += 1
            if req.generated == 1:
                req.first_token_at = t
                ev.append(EngineEvent("first_token", req.req_id, t, 1))
            if req.want_tokens:
                ev.append(EngineEvent("token", req.req_id, t, req.generated))
            if req.generated >= req.max_tokens:
                times = RequestTimes(req.arrival, req.scheduled_at, req.first_token_at, req.generated)
                ev.append(EngineEvent("finished", req.req_id, t, req.generated, times))
                self._reqs.pop(req.req_id, None)
            else:
                keep.append(req)
        self._running = keep

    # ------------------------------------------------------------------ gauges
    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _waiting_split(self) -> tuple[int, int]:
        batch = {r.lora_id for r in self._running if r.lora_id}
        deferred = 0
        for req in self._waiting:
            if req.lora_id and req.lora_id not in batch:
                if len(batch) >= self.params.max_loras:
                    deferred += 1
                    continue
                batch.add(req.lora_id)
        return deferred, len(self._waiting) - deferred

    @property
    def waiting_deferred(self) -> int:
        return self._waiting_split()[0]

    @property
    def waiting_capacity(self) -> int:
        return self._waiting_split()[1]

    @property
    def running_loras(self) -> list[str]:
        return sorted({r.lora for r in self._running if r.lora})

    @property
    def waiting_loras(self) -> list[str]:
        return sorted({r.lora for r in self._waiting if r.lora})

    @property
    def lora_info_adapters(self) -> list[str]:
        """Adapters of ``vllm:lora_requests_info`` (≥0.11.1): in flight AND past first output."""
        return sorted({r.lora for r in self._running if r.lora and r.generated > 0})

    @property
    def kv_cache_usage(self) -> float:
        used = sum(r.prompt_tokens + r.generated for r in self._running)
        return min(1.0, used / self.params.kv_cache_tokens) if self.params.kv_cache_tokens else 0.0

    @property
    def busy(self) -> bool:
        return bool(self._running or self._waiting)

    # ------------------------------------------------------------------ introspection
    def gpu_slots(self) -> list[int]:
        """lora_ids in GPU slots, LRU first."""
        return list(self._gpu)

    def cpu_cache(self) -> list[int]:
        """lora_ids in the CPU cache, LRU first."""
        return list(self._cpu)

    def state(self) -> dict[str, object]:
        names = {v: k for k, v in self._registry.items()}
        return {
            "registry": dict(self._registry),
            "gpu_slots": [
                {"lora_id": i, "name": self._adapters[i].name, "registered": i in names} for i in self._gpu
            ],
            "cpu_cache": [
                {"lora_id": i, "name": self._adapters[i].name, "registered": i in names} for i in self._cpu
            ],
            "adapters": {
                str(r.lora_id): {
                    "name": r.name,
                    "size_bytes": r.size_bytes,
                    "disk_loads": r.disk_loads,
                    "cpu_reloads": r.cpu_reloads,
                }
                for r in self._adapters.values()
            },
            "disk_loads": self.total_disk_loads,
            "cpu_reloads": self.total_cpu_reloads,
            "running": self.running,
            "waiting": self.waiting,
            "steps": self.steps,
        }
