"""Filesystem helpers for tests that need a volume which really fills up."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (root with CAP_SYS_ADMIN, as on the CI machine); the test
    is skipped where mounting is not allowed (an unprivileged container)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
