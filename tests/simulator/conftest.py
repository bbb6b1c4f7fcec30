"""Fixtures for simulator tests: adapter directories and in-process clients."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from registry.adapter_factory import write_adapter


@pytest.fixture
def make_adapter(tmp_path: Path) -> Callable[..., str]:
    """``make_adapter(name, **write_adapter_kwargs)`` → absolute path of a PEFT adapter dir."""

    def _make(name: str = "a", **kw: Any) -> str:
        return str(write_adapter(tmp_path / name, **kw))

    return _make
