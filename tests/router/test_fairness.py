"""The fair queue (``router.fairness``): virtual token counters order the requests waiting for a
slot — the tenant served least goes first, a tenant that starts waiting is lifted to the others'
counters, weights scale shares, a cancelled waiter leaves, and nobody starves."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from router.fairness import Charge, FairQueue, Policy, VirtualCounters, cost

POLL_S = 0.002  # how often the tests look
ROUND_S = 30.0  # the queue's polling: rounds run when a test frees a slot (``kick``)


def fair_queue(counters: VirtualCounters | None = None, policy: Policy = "vtc") -> FairQueue:
    return FairQueue(counters or VirtualCounters(), policy, poll_s=ROUND_S, min_gap_s=0)


class Slots:
    """A capacity freed one slot at a time; the requests wait in ``queue`` for their turns."""

    def __init__(self, queue: FairQueue, served_cost: float = 100.0) -> None:
        self.queue = queue
        self.free = 0
        self.served: list[str] = []
        self.served_cost = served_cost

    async def request(self, tenant: str, timeout: float = 30.0) -> bool:
        w = self.queue.waiter(tenant)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                if not await w.turn(deadline - loop.time()):
                    return False
                if self.free > 0:
                    self.free -= 1
                    self.served.append(tenant)
                    self.queue.counters.charge(tenant, self.served_cost)
                    return True
        finally:
            w.leave()

    async def grant(self, n: int = 1) -> None:
        """Free ``n`` slots, one after another once the last was taken."""
        for _ in range(n):
            async with asyncio.timeout(5):
                while self.queue.in_round:  # a slot frees between rounds: the first in order takes it
                    await asyncio.sleep(POLL_S)
                self.free += 1
                self.queue.kick()
                while self.free:
                    await asyncio.sleep(POLL_S)


async def settle(queue: FairQueue, n: int) -> None:
    async with asyncio.timeout(5):
        while queue.waiting != n:
            await asyncio.sleep(POLL_S)


def spawn(slots: Slots, tenant: str, n: int = 1) -> list[asyncio.Task[bool]]:
    return [asyncio.create_task(slots.request(tenant)) for _ in range(n)]


async def test_the_tenant_served_least_goes_first() -> None:
    q = fair_queue()
    slots = Slots(q)
    tasks = [*spawn(slots, "a"), *spawn(slots, "b"), *spawn(slots, "c")]
    await settle(q, 3)
    for tenant, served in (("a", 1000), ("b", 10), ("c", 500)):
        q.counters.charge(tenant, served)
    assert [w.tenant for w in q.order()] == ["b", "c", "a"]
    await slots.grant(3)
    assert slots.served == ["b", "c", "a"]
    assert all(await asyncio.gather(*tasks))
    assert q.waiting == 0


async def test_fifo_orders_by_arrival_whatever_the_counters() -> None:
    q = fair_queue(policy="fifo")
    slots = Slots(q)
    tasks = []
    for t in ("a", "b", "c"):
        tasks += spawn(slots, t)
        await settle(q, len(tasks))
    q.counters.charge("a", 1000)
    await slots.grant(3)
    assert slots.served == ["a", "b", "c"]
    await asyncio.gather(*tasks)


async def test_a_tenant_that_starts_waiting_is_lifted_to_the_others() -> None:
    counters = VirtualCounters()
    q = fair_queue(counters)
    slots = Slots(q)
    counters.charge("heavy", 5000)  # served much while nobody waited
    heavy = spawn(slots, "heavy", 3)
    await settle(q, 3)
    assert counters.counter("light") == 0
    light = spawn(slots, "light")
    await settle(q, 4)
    assert counters.counter("light") == 5000  # no credit banked for the time it was idle
    # then it goes first once the heavy tenant has been served once more
    await slots.grant(2)
    assert sorted(slots.served) == ["heavy", "light"]
    await slots.grant(2)
    await asyncio.gather(*heavy, *light)


async def test_into_an_empty_queue_a_tenant_is_lifted_to_the_last_one_that_left() -> None:
    counters = VirtualCounters()
    q = fair_queue(counters)
    slots = Slots(q)
    counters.charge("heavy", 5000)
    task = spawn(slots, "heavy")
    await settle(q, 1)
    await slots.grant(1)
    await asyncio.gather(*task)
    assert q.waiting == 0
    spawn(slots, "light")
    await settle(q, 1)
    assert counters.counter("light") == counters.counter("heavy") == 5100
    await slots.grant(1)


async def test_weights_scale_the_shares() -> None:
    q = fair_queue(VirtualCounters({"gold": 2.0}))
    slots = Slots(q)
    tasks = [*spawn(slots, "gold", 40), *spawn(slots, "std", 40)]
    await settle(q, 80)
    await slots.grant(30)
    shares = Counter(slots.served)
    assert shares == {"gold": 20, "std": 10}
    assert q.counters.counter("gold") == q.counters.counter("std") == 1000
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    q = fair_queue()
    slots = Slots(q)
    first = spawn(slots, "a")
    await settle(q, 1)
    second = spawn(slots, "b")
    await settle(q, 2)
    q.counters.charge("a", -1)  # a first
    assert [w.tenant for w in q.order()] == ["a", "b"]
    first[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await first[0]
    assert q.waiting == 1 and [w.tenant for w in q.order()] == ["b"]
    await slots.grant(1)  # the round goes on to the next waiter
    assert slots.served == ["b"] and await second[0]
    assert q.waiting == 0


async def test_a_waiter_gives_up_at_its_timeout() -> None:
    q = fair_queue()
    slots = Slots(q)
    assert await slots.request("a", timeout=0.05) is False
    assert q.waiting == 0


async def test_a_light_tenant_waits_for_one_slot_not_for_the_flood() -> None:
    q = fair_queue()
    slots = Slots(q)
    heavy = spawn(slots, "heavy", 50)
    await settle(q, 50)
    await slots.grant(5)
    light = spawn(slots, "light")
    await settle(q, 46)
    await slots.grant(2)  # one more for heavy at most (ties go to the older), then light's
    assert "light" in slots.served[-2:]
    assert await light[0]
    for t in heavy:
        t.cancel()
    await asyncio.gather(*heavy, return_exceptions=True)


async def test_nobody_starves_when_both_flood() -> None:
    counters = VirtualCounters()
    q = fair_queue(counters)
    slots = Slots(q)
    counters.charge("old", 100_000)  # served long ago, alone
    tasks = [*spawn(slots, "old", 20), *spawn(slots, "new", 20)]
    await settle(q, 40)
    await slots.grant(20)
    shares = Counter(slots.served)
    assert abs(shares["old"] - shares["new"]) <= 1  # the newcomer was lifted: no monopoly
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_a_charge_is_settled_with_the_usage_once() -> None:
    counters = VirtualCounters({"t": 2.0})
    charge = Charge(counters, "t", prompt_estimate=100)
    assert counters.counter("t") == cost(100, 0) / 2
    charge.settle(120, 10)
    assert counters.counter("t") == cost(120, 10) / 2 == 70
    charge.settle(500, 500)  # once only
    assert counters.counter("t") == 70
    unanswered = Charge(counters, "u", prompt_estimate=50)
    unanswered.settle(0, 0)  # no answer: nothing served
    assert counters.counter("u") == 0


async def test_behind_a_waiter_that_found_no_room_the_same_resource_waits_for_the_next_round() -> None:
    q = fair_queue()
    turns: Counter[str] = Counter()

    async def wait(tenant: str, resource: str) -> None:
        w = q.waiter(tenant, resource)
        try:
            while await w.turn(30):
                turns[resource] += 1  # never any room
        finally:
            w.leave()

    tasks = [asyncio.create_task(wait("a", "r1")) for _ in range(3)]
    await settle(q, 3)
    tasks.append(asyncio.create_task(wait("b", "r2")))
    await settle(q, 4)
    q.kick()
    async with asyncio.timeout(5):
        while not turns["r2"] or q.in_round:
            await asyncio.sleep(POLL_S)
    assert turns == {"r1": 1, "r2": 1}  # one try at r1 per round, not three
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
