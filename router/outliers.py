"""Passive outlier detection: replicas that fail requests or loads leave rotation for a while.

- ``mark_failure``: a failed check; out of rotation after ``unhealthy_after`` of them (at once
  when ``immediate``), and requests still waiting for that replica's first byte are aborted
  (retried elsewhere).
- ``note_failure`` / ``note_success``: after ``outlier_failures`` failed requests or loads in a
  row that are the replica's (connection or first-byte failures, or answers for at least two
  models), the replica leaves rotation for at least ``outlier_cooloff_s``.
- ``note_load``: after ``outlier_failures`` failed loads in a row, of at least two adapters, no
  new adapter is placed there for ``outlier_cooloff_s`` (``load_targets``); what it holds keeps
  serving, and requests served meanwhile do not reset the count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from router.replica import ReplicaState
from router.settings import RouterSettings

log = logging.getLogger("loraplane.router.store")


class Outliers:
    def __init__(
        self, settings: RouterSettings, *, clock: Callable[[], float], on_health: Callable[[str], None]
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._on_health = on_health  # called with the pool name when a replica leaves rotation
        self.loads_paused_until = 0.0  # the latest end of any replica's load pause

    def mark_failure(self, rep: ReplicaState, error: str, *, immediate: bool = False) -> None:
        rep.failures += 1
        if rep.healthy and (immediate or rep.failures >= self._settings.unhealthy_after):
            rep.healthy = False
            log.warning(
                "replica out of rotation: %s",
                error,
                extra={"replica": rep.url, "pool": rep.pool.name, "error": error, "failures": rep.failures},
            )
            self._on_health(rep.pool.name)
            for task in rep.pending:
                rep.aborted.add(task)
                task.cancel()

    def note_success(self, rep: ReplicaState) -> None:
        if rep.consecutive_failures:
            rep.consecutive_failures = 0
            rep.failed_models.clear()

    def note_failure(self, rep: ReplicaState, error: str, model: str | None = None) -> None:
        s = self._settings
        rep.consecutive_failures += 1
        rep.failed_models.add(model or "*")
        if rep.consecutive_failures >= s.outlier_failures and (
            "*" in rep.failed_models or len(rep.failed_models) >= 2
        ):
            rep.consecutive_failures = 0
            rep.failed_models.clear()
            rep.ejected_until = self._clock() + s.outlier_cooloff_s
            self.mark_failure(rep, f"{s.outlier_failures} failures in a row, last: {error}", immediate=True)

    def note_load(self, rep: ReplicaState, model: str, *, ok: bool, error: str = "") -> None:
        if ok:
            rep.load_failures = 0
            rep.load_failed_models.clear()
            return
        s = self._settings
        rep.load_failures += 1
        rep.load_failed_models.add(model)
        if rep.load_failures >= s.outlier_failures and len(rep.load_failed_models) >= 2:
            rep.load_failures = 0
            rep.load_failed_models.clear()
            rep.loads_paused_until = self._clock() + s.outlier_cooloff_s
            self.loads_paused_until = max(self.loads_paused_until, rep.loads_paused_until)
            log.warning(
                "replica refuses loads: no new adapters placed there for a while",
                extra={"replica": rep.url, "cooloff_s": s.outlier_cooloff_s, "error": error},
            )

    def load_targets(self, reps: list[ReplicaState], lora_name: str) -> list[ReplicaState]:
        """``reps`` less those whose loads are paused unless ``lora_name`` is there already; all
        of ``reps`` when that would leave none."""
        now = self._clock()
        if now >= self.loads_paused_until:  # no replica's loads are paused (the usual case)
            return reps
        out = [
            r
            for r in reps
            if now >= r.loads_paused_until
            or ((x := r.residents.get(lora_name)) is not None and x.state != "failed")
        ]
        return out or reps
