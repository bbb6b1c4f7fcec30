"""Shared plumbing for loraplane: settings base, database, errors, logging, HTTP and Redis factories.

No domain code lives here. Public surface:

- :mod:`kit.settings` — ``LoraplaneSettings`` (pydantic-settings base, env prefix ``LORAPLANE_``).
- :mod:`kit.db` — ``make_engine``, ``make_session_factory``, ``session_scope``; SQLite made to behave.
- :mod:`kit.orm` — ``Base`` declarative base with a naming convention.
- :mod:`kit.errors` — ``LoraplaneError`` tree and the admin error envelope.
- :mod:`kit.logs` — structured JSON logging.
- :mod:`kit.redis_factory` — ``make_redis`` (redis.asyncio with a blocking pool).
- :mod:`kit.ids` — slug validation and version names.
"""
