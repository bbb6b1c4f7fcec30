"""Cluster-wide replica state shared by gateway processes (SPEC §17); see ``router.cluster.base``."""

from router.cluster.base import OCCUPYING, Claim, ClusterState, LoadCaps, ReplicaShare
from router.cluster.board import Board, MemoryBoard, RedisBoard
from router.cluster.liveness import new_pid
from router.cluster.memory import MemoryCluster
from router.cluster.redis_state import RedisCluster

__all__ = [
    "OCCUPYING",
    "Board",
    "Claim",
    "ClusterState",
    "LoadCaps",
    "MemoryBoard",
    "MemoryCluster",
    "RedisBoard",
    "RedisCluster",
    "ReplicaShare",
    "new_pid",
]
