"""Cluster-wide replica state shared by gateway processes (SPEC §17); see ``router.cluster.base``."""

from router.cluster.base import OCCUPYING, Claim, ClusterState, LoadCaps, ReplicaShare, SharedRecord
from router.cluster.liveness import new_pid
from router.cluster.memory import MemoryCluster
from router.cluster.redis_state import RedisCluster

__all__ = [
    "OCCUPYING",
    "Claim",
    "ClusterState",
    "LoadCaps",
    "MemoryCluster",
    "RedisCluster",
    "ReplicaShare",
    "SharedRecord",
    "new_pid",
]
