"""Small asyncio helpers shared by the services (no domain code)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("loraplane.aio")


async def cancel_all(tasks: list[asyncio.Task[Any]], timeout: float = 5.0) -> None:
    """Cancel ``tasks`` and wait for them, bounded (re-cancelling stragglers once)."""
    live = [t for t in tasks if not t.done()]
    for _ in range(2):
        if not live:
            return
        for t in live:
            t.cancel()
        _, pending = await asyncio.wait(live, timeout=timeout)
        live = list(pending)
    if live:
        log.warning("tasks did not stop", extra={"tasks": [t.get_name() for t in live]})
