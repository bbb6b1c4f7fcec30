"""Errors inside the router runtime (the gateway sees ``router.contract``'s, never these)."""

from __future__ import annotations


class LoadError(Exception):
    """A load did not succeed; ``retry_elsewhere`` says whether another replica may help."""

    def __init__(self, message: str, *, failure: str, retry_elsewhere: bool) -> None:
        super().__init__(message)
        self.message = message
        self.failure = failure
        self.retry_elsewhere = retry_elsewhere
