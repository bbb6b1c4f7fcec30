"""The replica table's per-adapter sums (``router/placement/table.py``): requests in flight and
healthy copies are kept up to date as views are put, replaced, flip health or leave, so the
default policy reads them in O(1) whatever the number of holders; they always equal the sums
over the views, and the holder list follows the holders."""

from __future__ import annotations

import random

from router.placement.table import ReplicaTable
from tests.router.test_placement_support import res, view


def _truth(t: ReplicaTable, name: str) -> tuple[int, int, list[str]]:
    inflight = copies = 0
    held = []
    for url, v in t.views.items():
        r = v.residents.get(name)
        if r is None:
            continue
        held.append(url)
        inflight += r.inflight
        if v.healthy and r.state != "failed":
            copies += 1
    return inflight, copies, held


def test_sums_follow_every_put_replace_health_flip_and_removal() -> None:
    t = ReplicaTable()
    t.put(view("http://a", res("x", inflight=2), res("y")))
    t.put(view("http://b", res("x", inflight=1), res("y", state="failed")))
    assert (t.inflight("x"), t.healthy_copies("x"), t.holder_list("x")) == (3, 2, ["http://a", "http://b"])
    assert (t.inflight("y"), t.healthy_copies("y")) == (0, 1)
    t.put(view("http://b", res("x", inflight=1), healthy=False))  # b unhealthy, y gone from it
    assert (t.inflight("x"), t.healthy_copies("x"), t.holder_list("y")) == (3, 1, ["http://a"])
    t.remove("http://a")
    assert (t.inflight("x"), t.healthy_copies("x"), t.holder_list("x")) == (1, 0, ["http://b"])
    assert t.holder_list("y") == [] and t.inflight("y") == 0 and t.healthy_copies("y") == 0
    t.remove("http://b")
    assert t._inflight == {} and t._copies == {}  # nothing kept for adapters no replica holds
    assert t.holder_list("never-held") == [] and t._lists == {}


def test_sums_equal_the_views_after_many_random_changes() -> None:
    rng = random.Random(7)
    t = ReplicaTable()
    names = [f"a{i}" for i in range(6)]
    for _ in range(500):
        url = f"http://r{rng.randrange(8)}"
        if rng.random() < 0.1:
            t.remove(url)
            continue
        held = rng.sample(names, rng.randrange(len(names)))
        rs = [
            res(n, inflight=rng.randrange(3), state=rng.choice(["resident", "loading", "failed"]))
            for n in held
        ]
        t.put(view(url, *rs, healthy=rng.random() < 0.8))
        for n in names:
            inflight, copies, holders = _truth(t, n)
            assert (t.inflight(n), t.healthy_copies(n), sorted(t.holder_list(n))) == (
                inflight,
                copies,
                sorted(holders),
            )
