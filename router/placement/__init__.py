"""Placement: a pure, pluggable choice of replica per request (SPEC §8, DESIGN.md example 8).

Public surface::

    from router.placement import make_profile, profile_from_config
    profile = make_profile("default")                       # or "round-robin", "least-request",
    decision = profile.pick(request, replicas, now)          # "random", "gie-lora-affinity",
                                                             # "llm-d", "custom"

``profile_from_config(settings.placement_profile, settings.placement_params)`` accepts the
params as a JSON object string (``LORAPLANE_PLACEMENT_PARAMS``) or a mapping. The default
policy is ``default.py`` (one implementation, priced by ``costs.py`` over a ``table.py``
index); the other profiles run the plugin pipeline (``framework.py``: ``filters``, ``scorers``,
``pickers``, ``evictors``). The placement plan is ``plan.py``. Tables: ``README.md``.
"""

from router.placement.default import DefaultPolicy
from router.placement.framework import Evictor, Filter, PickContext, Picker, SchedulerProfile, Scorer, summary
from router.placement.profiles import BASELINES, PROFILES, make_profile, profile_from_config
from router.placement.table import ReplicaTable
from router.placement.types import (
    Decision,
    PlacementRequest,
    Profile,
    ReplicaView,
    Residency,
)

__all__ = [
    "BASELINES",
    "PROFILES",
    "Decision",
    "DefaultPolicy",
    "Evictor",
    "Filter",
    "PickContext",
    "Picker",
    "PlacementRequest",
    "Profile",
    "ReplicaTable",
    "ReplicaView",
    "Residency",
    "SchedulerProfile",
    "Scorer",
    "make_profile",
    "profile_from_config",
    "summary",
]
