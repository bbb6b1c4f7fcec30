"""Fixtures of the browser tier (helpers in ``console_platform``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.console.console_platform import Up, run_up


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with run_up(tmp_path_factory.mktemp("console-up")) as u:
        yield u
