"""Fair ordering of the requests waiting for capacity: virtual token counters (VTC).

Sheng et al., "Fairness in Serving Large Language Models" (OSDI'24). Each tenant has a counter
of the service it received: ``PROMPT_WEIGHT`` × prompt tokens + ``COMPLETION_WEIGHT`` ×
completion tokens, divided by the tenant's weight (``fairness_weights``; default 1). A request
is charged an estimate of its prompt when it is sent and settled with the usage the replica
reported once it ends. A tenant that starts waiting while others wait is lifted to the smallest
counter among them (to that of the last tenant to stop waiting when none wait), so idle time
banks no credit. A ``FairQueue`` holds the requests that found no free slot; every ``poll_s``
(a slot may have freed in another process), or at once when one freed here (``kick``), it
runs a round: each waiter in turn, the tenant with the smallest counter first (on a tie: the
tenant with fewer waiting, then the oldest), gets one try at a place. A waiter that gets one
leaves; one that does not keeps its place for the next round. ``fifo`` orders by
arrival only (the baseline of ``benchmarks/fairness.py``).

Counters and queues are per gateway process: each process orders its own waiters (the
gateways' shares of a tenant's traffic are alike behind a load balancer). Between processes,
a replica's load slots go by turns (``router.cluster.LoadCaps.turn_ttl_s``): the process whose
load just ended does not claim the slot again for its own queue while another process waits
there, and background loads (prewarms, the plan's) take a slot only while no process waits.
Sharing counters cluster-wide (Redis) is not done.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Literal

Policy = Literal["vtc", "fifo"]
PROMPT_WEIGHT = 1.0
COMPLETION_WEIGHT = 2.0  # the paper's w_q: a generated token costs more than a prompt token
TURN_S = 1.0  # longest one waiter holds its turn (a try that hangs does not stall the round)
BACKGROUND = ""  # the tenant of work no request started (prewarms, the placement plan)

_tenant: ContextVar[str] = ContextVar("loraplane_fair_tenant", default=BACKGROUND)


def current_tenant() -> str:
    """The tenant of the request this task (or the task that started it) serves."""
    return _tenant.get()


def set_tenant(tenant: str) -> None:
    """Tasks started from here on (a load, by ``asyncio.create_task``) inherit the tenant."""
    _tenant.set(tenant)


def cost(prompt_tokens: int, completion_tokens: int) -> float:
    return PROMPT_WEIGHT * prompt_tokens + COMPLETION_WEIGHT * completion_tokens


class VirtualCounters:
    """Weighted service received per tenant (shared by the queues of one process)."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self._weights = dict(weights or {})
        self._counters: dict[str, float] = {}

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def charge(self, tenant: str, amount: float) -> None:
        """Add ``amount`` of service (token cost; negative: a correction), scaled by the weight."""
        w = self._weights.get(tenant, 1.0)
        self._counters[tenant] = self._counters.get(tenant, 0.0) + amount / (w if w > 0 else 1.0)

    def lift(self, tenant: str, floor: float) -> None:
        if self._counters.get(tenant, 0.0) < floor:
            self._counters[tenant] = floor


class Charge:
    """One request's charge: its estimated prompt when it is sent, settled with the usage the
    replica reported when it ends (kept as estimated when none came)."""

    def __init__(self, counters: VirtualCounters, tenant: str, prompt_estimate: int) -> None:
        self._counters = counters
        self._tenant = tenant
        self._estimate = cost(prompt_estimate, 0)
        self._settled = False
        counters.charge(tenant, self._estimate)

    def settle(self, prompt_tokens: int | None, completion_tokens: int = 0) -> None:
        if self._settled or prompt_tokens is None:
            return
        self._settled = True
        self._counters.charge(self._tenant, cost(prompt_tokens, completion_tokens) - self._estimate)


class Waiter:
    """One request's place in a ``FairQueue`` (kept across its tries: it never loses its age)."""

    def __init__(self, queue: FairQueue, tenant: str, seq: int, resource: str | None = None) -> None:
        self.tenant = tenant
        self.seq = seq
        self.resource = resource
        self._queue = queue
        self._go = asyncio.Event()  # set by the round: this waiter's turn
        self._done = asyncio.Event()  # set by the waiter: its try is over (or it left)
        self.queued = False

    async def turn(self, timeout: float) -> bool:
        """Wait (in the queue) for the next turn to try for a place; False: ``timeout`` passed
        first (the waiter has left). Calling it again means the last try found no room."""
        self._done.set()  # hand back a turn held
        if not self.queued:
            self._queue._join(self)
        self._go.clear()
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await self._go.wait()
        except TimeoutError:
            self.leave()
            return False
        self._go.clear()
        return True

    def leave(self) -> None:
        """Out of the queue: placed, or gone (idempotent)."""
        self._done.set()
        if self.queued:
            self._queue._leave(self)


class FairQueue:
    """The waiters for one kind of capacity in this process (cold slots; load slots)."""

    def __init__(
        self,
        counters: VirtualCounters,
        policy: Policy = "vtc",
        *,
        poll_s: float = 0.05,
        min_gap_s: float | None = None,
    ) -> None:
        self.counters = counters
        self.policy = policy
        self._poll_s = poll_s
        self._min_gap_s = poll_s / 2 if min_gap_s is None else min_gap_s  # between rounds
        self._waiters: dict[int, Waiter] = {}
        self._active: dict[str, int] = {}  # tenant → its waiters queued
        self._last_left = 0.0  # the counter of the last tenant that stopped waiting
        self._seq = itertools.count()
        self._rounds: asyncio.Task[None] | None = None
        self._kicked = asyncio.Event()
        self.in_round = False  # turns are being given
        self._last_round = 0.0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def waiter(self, tenant: str, resource: str | None = None) -> Waiter:
        """A place for a request of ``tenant`` (queued at its first ``turn``). Waiters for the same
        ``resource`` (a replica's load slots) are served in order: once one found no room in a
        round, the ones after it wait for the next round (every process claims a freed slot
        about as often, however many it has waiting)."""
        return Waiter(self, tenant, next(self._seq), resource)

    def kick(self) -> None:
        """A slot freed in this process: the next round starts now, not after ``poll_s`` (at most
        one per ``min_gap_s``, default ``poll_s`` / 2). Slots freed in other processes are found
        by the polling."""
        if self._waiters:
            self._kicked.set()

    def order(self) -> list[Waiter]:
        """The queued waiters, the next to try first."""
        return sorted(self._waiters.values(), key=self._key)

    def _key(self, w: Waiter) -> tuple[float, int, int]:
        if self.policy == "fifo":
            return (0.0, 0, w.seq)
        # equal counters (a tenant lifted to another's): the one with fewer waiting goes first
        return (self.counters.counter(w.tenant), self._active.get(w.tenant, 0), w.seq)

    def _join(self, w: Waiter) -> None:
        if w.tenant not in self._active:  # newly active: no credit for the time it was idle
            others = [self.counters.counter(t) for t in self._active]
            self.counters.lift(w.tenant, min(others) if others else self._last_left)
        self._active[w.tenant] = self._active.get(w.tenant, 0) + 1
        self._waiters[w.seq] = w
        w.queued = True
        if self._rounds is None or self._rounds.done():
            self._rounds = asyncio.create_task(self._run(), name="fair-queue")

    def _leave(self, w: Waiter) -> None:
        w.queued = False
        self._waiters.pop(w.seq, None)
        left = self._active.get(w.tenant, 1) - 1
        if left > 0:
            self._active[w.tenant] = left
        else:
            self._active.pop(w.tenant, None)
            self._last_left = self.counters.counter(w.tenant)

    async def _run(self) -> None:
        """Rounds while anyone waits: each waiter queued when a round starts gets one turn, the
        tenant with the smallest counter (as it is now: counters move during a round) first,
        each tenant's waiters oldest first (O(tenants) a turn)."""
        loop = asyncio.get_running_loop()
        while self._waiters:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_s):
                    await self._kicked.wait()
            self._kicked.clear()
            await asyncio.sleep(max(0.0, self._last_round + self._min_gap_s - loop.time()))
            self._last_round = loop.time()
            self.in_round = True
            lines: dict[str, deque[Waiter]] = {}
            for w in sorted(self._waiters.values(), key=lambda w: w.seq):
                lines.setdefault(w.tenant, deque()).append(w)
            full: set[str] = set()  # resources a waiter found no room at in this round
            while lines and not self._kicked.is_set():  # kicked: start again from the first
                tenant = min(lines, key=lambda t: self._key(lines[t][0]))
                line = lines[tenant]
                w = line.popleft()
                if not line:
                    del lines[tenant]
                if not w.queued or w.resource in full:
                    continue
                w._done.clear()
                w._go.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TURN_S):
                        await w._done.wait()
                if w.queued and w.resource is not None:  # still waiting: no room there
                    full.add(w.resource)
            self.in_round = False

    async def stop(self) -> None:
        task = self._rounds
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
