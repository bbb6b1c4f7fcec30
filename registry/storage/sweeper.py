"""The orphan sweeper: ``ArtifactStore.sweep`` at start-up and then every ``interval_s``.

A background thread (daemon) of the admin API process. Each sweep removes what failed uploads
left behind and is older than ``older_than_s`` (unfinished multipart uploads, version prefixes
no version row names; see ``registry.storage.s3_cleanup``). A sweep that fails (S3 or the
database down) is logged and tried again at the next tick; several registry processes may sweep
the same bucket (every step is idempotent, and S3 uploads that another process has open are
left alone: their leases, ``registry.storage.s3_leases``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kit.errors import LoraplaneError
from registry.storage.base import ArtifactStore, SweepReport

log = logging.getLogger(__name__)


class OrphanSweeper:
    def __init__(
        self,
        store: ArtifactStore,
        referenced: Callable[[list[str]], set[str]],
        *,
        interval_s: float,
        older_than_s: float,
    ) -> None:
        self.store = store
        self.referenced = referenced
        self.interval_s = interval_s
        self.older_than_s = older_than_s
        self.sweeps = 0
        self.last: SweepReport | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orphan-sweeper", daemon=True)

    def start(self) -> OrphanSweeper:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def sweep_once(self) -> SweepReport | None:
        """One sweep; None (logged) if the store or the database refused."""
        try:
            report = self.store.sweep(self.referenced, self.older_than_s)
        except (LoraplaneError, OSError) as e:
            log.warning("orphan sweep failed: %s", e, extra={"event": "storage_sweep_failed"})
            return None
        except Exception as e:  # the database (SQLAlchemy) down must not end the thread
            log.warning("orphan sweep failed: %s", e, extra={"event": "storage_sweep_failed"})
            return None
        self.sweeps += 1
        self.last = report
        if report.prefixes_deleted or report.uploads_aborted:
            log.info(
                "orphan sweep removed %d version locations (%d objects) and %d unfinished uploads",
                len(report.prefixes_deleted),
                report.objects_deleted,
                report.uploads_aborted,
                extra={"event": "storage_sweep", "prefixes": report.prefixes_deleted[:20]},
            )
        return report

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sweep_once()
            if self._stop.wait(self.interval_s):
                return
