"""Where an adapter would come from on a replica: the GPU, the CPU tier, disk, or a load.

vLLM keeps ``max_loras`` adapters in GPU slots and ``max_cpu_loras`` in host memory, both LRU
(``vllm/lora/worker_manager.py``); every adapter registered through the load API beyond those is
re-read from its ``lora_path`` on its next use, inside the engine step. The router cannot see
those caches, so it estimates them from what it routed: on a replica, the adapters with requests
in flight are on the GPU; the other registered ones, most recently used first, fill the rest of
the ``max_loras`` GPU slots, then the ``max_cpu_loras`` host cache, and the rest are on disk.

| tier   | what a request for the adapter costs there                                       |
|--------|----------------------------------------------------------------------------------|
| `gpu`  | nothing                                                                          |
| `cpu`  | a copy from host memory into a GPU slot (milliseconds)                           |
| `disk` | the engine re-reads the files inside its step (tens of milliseconds and up)      |
| `load` | not registered there: loraplane stages, verifies and loads it (a cold load)      |

Estimated once per view (memoised in ``ReplicaView.derived``).
"""

from __future__ import annotations

from router.placement.types import ReplicaView, Tier

_KEY = "tiers"
PRESENT_STATES = frozenset({"staging", "loading", "resident"})


def tiers(view: ReplicaView) -> dict[str, Tier]:
    """lora_name → estimated tier of every ``resident`` adapter of ``view`` (memoised)."""
    memo = view.derived.get(_KEY)
    if memo is not None:
        return memo  # type: ignore[no-any-return]
    out: dict[str, Tier] = {}
    idle = []
    for r in view.residents.values():
        if r.state != "resident":
            continue
        if r.inflight > 0:
            out[r.lora_name] = "gpu"
        else:
            idle.append(r)
    idle.sort(key=lambda r: (-r.last_used, r.lora_name))
    gpu_left = max(0, view.max_loras - len(out))
    cpu_left = max(0, view.cpu_loras - view.max_loras)
    for r in idle:
        if gpu_left > 0:
            out[r.lora_name] = "gpu"
            gpu_left -= 1
        elif cpu_left > 0:
            out[r.lora_name] = "cpu"
            cpu_left -= 1
        else:
            out[r.lora_name] = "disk"
    view.derived[_KEY] = out
    return out


def tier_of(view: ReplicaView, lora_name: str | None) -> Tier:
    """The tier a request for ``lora_name`` meets on ``view`` (``load`` when not registered
    there; ``gpu`` while its load is in flight: the load puts it in a slot)."""
    if lora_name is None:
        return ""
    r = view.residents.get(lora_name)
    if r is None or r.state not in PRESENT_STATES:
        return "load"
    if r.state != "resident":
        return "gpu"
    return tiers(view).get(lora_name, "gpu")
