"""Names of the cluster state's Redis keys under one prefix (their layout: ``router.cluster.lua``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str

    @property
    def procs(self) -> str:
        """Live gateway processes (sorted set pid → lease expiry)."""
        return f"{self.prefix}cl:procs"

    def res(self, url: str) -> str:
        """Residency records of a replica."""
        return f"{self.prefix}cl:res:{url}"

    def marks(self, url: str) -> str:
        """In-flight marks on a replica, per process."""
        return f"{self.prefix}cl:mark:{url}"

    def checked(self, url: str) -> list[str]:
        """A replica's records, its marks and the live processes: what the Lua rules check together."""
        return [self.res(url), self.marks(url), self.procs]

    def turns(self, url: str) -> str:
        """Processes waiting for a replica's load slot, and the last one to claim one (``lua.CLAIM``)."""
        return f"{self.prefix}cl:turn:{url}"

    def gone(self, url: str) -> str:
        """Tombstones of a replica's recent unloads (see ``lua.SYNC``)."""
        return f"{self.prefix}cl:gone:{url}"

    def lead(self, chore: str) -> str:
        """The process running a cluster-wide chore."""
        return f"{self.prefix}cl:lead:{chore}"

    def loads(self, pool: str) -> str:
        """Loads in flight in a pool."""
        return f"{self.prefix}cl:loads:{pool}"

    def demand(self, bucket: int) -> str:
        """Requests per lora_name routed in one time bucket, every process (``board.py``)."""
        return f"{self.prefix}cl:demand:{bucket}"

    @property
    def plan(self) -> str:
        """The placement plan the chore leader published (``board.py``)."""
        return f"{self.prefix}cl:plan"
