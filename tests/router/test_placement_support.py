"""Builders of crafted replica snapshots for the placement tests."""

from __future__ import annotations

from router.placement.types import PlacementRequest, ReplicaView, Residency, ResidencyState


def res(
    name: str, *, state: ResidencyState = "resident", last_used: float = 0.0, inflight: int = 0
) -> Residency:
    return Residency(lora_name=name, adapter_id=name, state=state, last_used=last_used, inflight=inflight)


def view(
    url: str,
    *residents: Residency,
    healthy: bool = True,
    max_loras: int = 2,
    max_adapters: int = 4,
    inflight: int | None = None,
    waiting: int = 0,
    max_num_seqs: int = 100,
    kv: float = 0.0,
    lora_running: tuple[str, ...] = (),
    lora_waiting: tuple[str, ...] = (),
) -> ReplicaView:
    """A replica view; ``inflight`` defaults to the sum of its residents' in-flight counts."""
    total = sum(r.inflight for r in residents) if inflight is None else inflight
    return ReplicaView(
        url=url,
        pool="p",
        healthy=healthy,
        max_loras=max_loras,
        max_adapters=max_adapters,
        residents={r.lora_name: r for r in residents},
        inflight=total,
        waiting=waiting,
        kv_cache_usage=kv,
        lora_running=lora_running,
        lora_waiting=lora_waiting,
        max_num_seqs=max_num_seqs,
    )


def req(name: str | None, exclude: tuple[str, ...] = ()) -> PlacementRequest:
    return PlacementRequest(lora_name=name, adapter_id=name, exclude=frozenset(exclude))
