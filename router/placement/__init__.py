"""Placement: a pure, pluggable choice of replica per request (SPEC §8, DESIGN.md example 8).

Public surface::

    from router.placement import make_profile, profile_from_config
    profile = make_profile("default")                       # or "round-robin", "least-request",
    decision = profile.pick(request, replicas, now)          # "random", "gie-lora-affinity", "custom"

``profile_from_config(settings.placement_profile, settings.placement_params)`` accepts the
params as a JSON object string (``LORAPLANE_PLACEMENT_PARAMS``) or a mapping. Plugins live in
``filters``, ``scorers``, ``pickers``; the tables are in ``router/placement/README.md``.
"""

from router.placement.framework import Evictor, Filter, PickContext, Picker, SchedulerProfile, Scorer, summary
from router.placement.profiles import BASELINES, PROFILES, make_profile, profile_from_config
from router.placement.types import (
    Decision,
    PlacementRequest,
    Profile,
    ReplicaView,
    Resident,
)

__all__ = [
    "BASELINES",
    "PROFILES",
    "Decision",
    "Evictor",
    "Filter",
    "PickContext",
    "Picker",
    "PlacementRequest",
    "Profile",
    "ReplicaView",
    "Resident",
    "SchedulerProfile",
    "Scorer",
    "make_profile",
    "profile_from_config",
    "summary",
]
