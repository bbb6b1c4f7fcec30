"""The stager of each pool, by its ``staging`` config: ``local`` (a shared directory),
``agent`` (``loraplane agent`` beside each replica) or ``publish`` (the store an engine that loads
adapters by name reads; ``router.publish``)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from router.publish import S3Publisher
from router.settings import RouterSettings
from router.staging import AgentStager, LocalStager, ReadableStore, Stager


def make_stagers(
    settings: RouterSettings, artifacts: ReadableStore, session: aiohttp.ClientSession
) -> dict[str, Stager]:
    """The stager of each pool (its ``staging`` config)."""
    stagers: dict[str, Stager] = {}
    for p in settings.pools:
        if p.staging.mode == "agent":
            stagers[p.name] = AgentStager(
                p.staging.url_template,
                p.staging.token.get_secret_value() if p.staging.token else None,
                artifacts,
                session,
                replica_dir=p.staging.dir,
                timeout_s=max(settings.load_timeout_s, 30.0),
            )
        elif p.staging.mode == "publish":
            uri = p.staging.uri or ""
            if uri.startswith("file://"):  # a directory (simulated replicas): published like a local stage
                stagers[p.name] = LocalStager(Path(uri[len("file://") :]), artifacts)
            else:
                stagers[p.name] = S3Publisher(p.staging, artifacts)
        else:
            stagers[p.name] = LocalStager(p.staging.dir or settings.resolved_staging_dir(), artifacts)
    return stagers
