"""What each engine does itself, as data (DESIGN example 21: drivers declare, callers ask).

The router, placement, loader, unloader, fallback and canary code read a pool's
:class:`Capabilities`, never its engine's name. The table is pure data (no I/O, no imports of
the drivers), so settings validation and the docs can read it too.

| | vllm | sglang | ray-serve | trtllm |
|---|---|---|---|---|
| ``load_mode`` | explicit | explicit | lazy_by_name | per_request |
| ``residency`` | exact | exact | advisory | advisory |
| ``implicit_reload`` | no | yes | yes | no |
| ``needs_int_id`` | no | no | no | yes |
| ``pinning`` | no | yes | no | no |
| ``plane_evicts`` | yes | yes | no | yes (its ledger) |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

EngineName = Literal["vllm", "sglang", "ray-serve", "trtllm"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)

LoadMode = Literal["explicit", "lazy_by_name", "per_request"]
ResidencyKind = Literal["exact", "advisory", "opaque"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an engine does for adapters, and so what the plane must do for it.

    - ``load_mode``: ``explicit`` — a load call registers the adapter (the plane stages files,
      then calls it); ``lazy_by_name`` — the engine loads a name from a store on the first request
      for it (the plane *publishes* verified files there: the "load" is the publish);
      ``per_request`` — every request carries the adapter (name, integer id, path) and the engine
      loads it on a cache miss (the plane stages files and builds the request).
    - ``residency``: ``exact`` — the engine lists what it holds (``/v1/models``): every poll
      reconciles the plane's records with the listing; ``advisory`` — the plane's records are a
      ledger of what it loaded, published or sent (the engine's own caches may have dropped it:
      the next request reloads it); ``opaque`` — nothing is known (no built-in engine).
    - ``implicit_reload``: a name the engine has seen stays servable after it left the engine's
      memory (SGLang reloads it from the path it remembers; Ray downloads it again): "not
      resident now" does not mean "cannot serve", and the files stay where the engine reads them
      until the version is retired or disabled.
    - ``needs_int_id``: requests carry a stable integer id per version (never reused for other
      bytes): the registry's version id.
    - ``pinning``: hot adapters can be pinned in a GPU slot (at most ``max_loras - 1`` of them).
    - ``plane_evicts``: the plane keeps ``max_adapters`` per replica by unloading (or, for an
      advisory ledger, forgetting) least recently used adapters; False — the engine's own LRU
      bounds what it holds and the plane never evicts to make room (it only retires versions).
    """

    load_mode: LoadMode
    residency: ResidencyKind
    implicit_reload: bool = False
    needs_int_id: bool = False
    pinning: bool = False
    plane_evicts: bool = True

    @property
    def lists_adapters(self) -> bool:
        """The replica's listing is the truth about what it holds (reconcile on every poll)."""
        return self.residency == "exact"


CAPABILITIES: dict[str, Capabilities] = {
    "vllm": Capabilities(load_mode="explicit", residency="exact"),
    "sglang": Capabilities(load_mode="explicit", residency="exact", implicit_reload=True, pinning=True),
    "ray-serve": Capabilities(
        load_mode="lazy_by_name", residency="advisory", implicit_reload=True, plane_evicts=False
    ),
    "trtllm": Capabilities(load_mode="per_request", residency="advisory", needs_int_id=True),
}


def capabilities_of(engine: str) -> Capabilities:
    """The capabilities of ``engine`` (ValueError for an unknown one)."""
    try:
        return CAPABILITIES[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINE_NAMES)}") from None
