"""One error base, one code→status table, one envelope per API.

Exception tree::

    LoraplaneError                 code, message, details, status
    ├── InvalidRequest        422  invalid_request     (body not JSON, wrong schema)
    ├── InvalidAdapter        422  invalid_adapter     (details.problems: list[str])
    ├── Unauthorized          401  unauthorized
    ├── Forbidden             403  forbidden
    ├── NotFound              404  not_found (or a more specific code)
    ├── Conflict              409  conflict  (or a more specific code)
    ├── PayloadTooLarge       413  payload_too_large
    └── Unavailable           503  unavailable

The admin API renders any of them as ``{"error": {"code", "message", "details"}}``; the
gateway renders its own errors in OpenAI's shape. Library errors (httpx, boto3, redis,
SQLAlchemy) are translated into this tree at the boundary where they are caught.
"""

from __future__ import annotations

from typing import Any


class LoraplaneError(Exception):
    status: int = 400
    code: str = "bad_request"

    def __init__(
        self, message: str, *, code: str | None = None, details: Any = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.details = details

    def envelope(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidRequest(LoraplaneError):
    status = 422
    code = "invalid_request"


class InvalidAdapter(LoraplaneError):
    status = 422
    code = "invalid_adapter"

    def __init__(self, problems: list[str], message: str = "adapter failed validation") -> None:
        super().__init__(message, details={"problems": list(problems)})
        self.problems = list(problems)


class Unauthorized(LoraplaneError):
    status = 401
    code = "unauthorized"


class Forbidden(LoraplaneError):
    status = 403
    code = "forbidden"


class NotFound(LoraplaneError):
    status = 404
    code = "not_found"


class Conflict(LoraplaneError):
    status = 409
    code = "conflict"


class PayloadTooLarge(LoraplaneError):
    status = 413
    code = "payload_too_large"


class Unavailable(LoraplaneError):
    status = 503
    code = "unavailable"
