"""Gateway errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

One class, one status→type table (SPEC §13). ``code`` is the specific snake_case code:
``invalid_request``, ``invalid_api_key``, ``adapter_disabled``, ``version_disabled``,
``model_not_found``, ``rate_limit_exceeded``, ``no_capacity``, ``adapter_load_failed``,
``upstream_timeout``, ``upstream_error``, ``rate_limiter_unavailable``, ``not_ready``,
``payload_too_large``, ``not_found``, ``method_not_allowed``.
"""

from __future__ import annotations

import orjson

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    """OpenAI's error category for an HTTP status."""
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


class GatewayError(Exception):
    """An answer the gateway gives instead of forwarding. Rendered by :meth:`body`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        retry_after: int | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.details = details

    def body(self) -> bytes:
        return error_body(self.status, self.code, self.message, self.param, self.details)


def error_body(
    status: int, code: str, message: str, param: str | None = None, details: dict[str, object] | None = None
) -> bytes:
    """OpenAI's error object; ``details`` (e.g. which rate limit a 429 hit) is added when given."""
    err: dict[str, object] = {"message": message, "type": error_type(status), "param": param, "code": code}
    if details is not None:
        err["details"] = details
    return orjson.dumps({"error": err})


def invalid(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, "invalid_request", message, param=param)


def model_not_found(model: str) -> GatewayError:
    # Same text for unknown and not-granted models: no existence leak.
    return GatewayError(
        404,
        "model_not_found",
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
    )
