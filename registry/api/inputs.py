"""Path parameters without control characters, checked for every admin route (SPEC §18).

The query string and JSON bodies are checked before routing (``kit.inputs.InputGuard``); path
parameters are checked here, after routing, so the error names the parameter. A NUL never
reaches PostgreSQL (which refuses it in ``text`` values: a 500 before this check).
"""

from __future__ import annotations

from fastapi import Request

from kit.errors import InvalidRequest
from kit.inputs import text_problem


def safe_path_params(request: Request) -> None:
    """App-wide dependency: 422 ``invalid_request`` naming the first path parameter that holds a
    NUL or another control character."""
    for name, value in request.path_params.items():
        problem = text_problem(value) if isinstance(value, str) else None
        if problem is not None:
            raise InvalidRequest(f"{name} {problem}", details={"field": name})
