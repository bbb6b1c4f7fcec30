"""The gateway's OpenAPI document, served at ``GET /openapi.json`` (SPEC §6, §18).

A hand-written file shipped with the package (``gateway/openapi.json``): the gateway is a plain
ASGI app, and its contract is OpenAI's request and response bodies plus the fields the gateway
checks itself (``gateway.parse``). The fuzz tier (``tests/fuzz``) runs Schemathesis against it.
"""

from __future__ import annotations

from importlib.resources import files

OPENAPI_JSON: bytes = files("gateway").joinpath("openapi.json").read_bytes()
