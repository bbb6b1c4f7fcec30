"""Route: the placement plan (issue 28), delegated to the router's ``ReplicaDirectory``.

``GET /admin/v1/replicas/plan``: what the cluster's placement controller (the chore leader)
last published — per pool the desired replicas (the autoscaling signal), per planned adapter
version its forecast demand, the replicas the plan gives it and where it is now. 503
``replicas_unavailable`` without a directory or when it cannot be read, like ``GET /replicas``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel as Schema
from pydantic import ConfigDict

from kit.errors import LoraplaneError, Unavailable
from registry.api.deps import state_of
from registry.auth import Principal
from registry.auth.dependencies import requires

router = APIRouter()

Reader = Annotated[Principal, Depends(requires("read"))]


class PlacedOut(Schema):
    url: str
    state: str


class PlannedAdapterOut(Schema):
    model_config = ConfigDict(extra="allow")
    adapter: str
    version: str
    lora_name: str
    demand_rps: float
    planned_replicas: int
    targets: list[str]
    current: list[PlacedOut]
    missing: list[str]


class PlanOut(Schema):
    model_config = ConfigDict(extra="allow")
    published: bool
    at: str | None = None
    age_s: float | None = None
    desired_replicas: dict[str, int]
    overflow: int = 0
    adapters: list[PlannedAdapterOut]


@router.get("/replicas/plan", tags=["replicas"], responses={200: {"model": PlanOut}})
async def placement_plan(request: Request, who: Reader) -> dict[str, Any]:
    """The placement plan the cluster's controller published (``published: false`` while none is)."""
    directory = state_of(request).replica_directory
    if directory is None:
        raise Unavailable("no replica directory is attached to this admin API", code="replicas_unavailable")
    try:
        return dict(await directory.plan())
    except LoraplaneError:
        raise
    except Exception as e:
        raise Unavailable(f"replica directory failed: {e}", code="replicas_unavailable") from e
