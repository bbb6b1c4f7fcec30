"""Settings base shared by every service.

Every service defines its own typed settings class deriving from :class:`LoraplaneSettings`;
all read environment variables with the ``LORAPLANE_`` prefix and, optionally, a config file
named by ``LORAPLANE_CONFIG`` (TOML or JSON; environment variables win over the file).

An empty value counts as unset, in the environment and in the file alike: a manifest line
``LORAPLANE_S3_ENDPOINT_URL: ""`` means "use the default" (AWS S3), not "the endpoint is ''".
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)


def _config_file_values() -> dict[str, Any]:
    path = os.environ.get("LORAPLANE_CONFIG")
    if not path:
        return {}
    p = Path(path)
    raw = p.read_bytes()
    data = tomllib.loads(raw.decode()) if p.suffix == ".toml" else json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a table/object at the top level")
    return {str(k).lower(): v for k, v in data.items() if v != ""}


class LoraplaneSettings(BaseSettings):
    """Base for all service settings: ``LORAPLANE_`` env prefix, optional config file; empty = unset."""

    model_config = SettingsConfigDict(
        env_prefix="LORAPLANE_", extra="ignore", populate_by_name=True, env_ignore_empty=True
    )

    _file_cache: ClassVar[dict[str, Any] | None] = None

    data_dir: Path = Field(
        default=Path(".loraplane"),
        description="Directory for the embedded defaults: SQLite file, local artifacts, staging.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL (postgresql+psycopg://… in production). Default: SQLite in data_dir.",
    )
    database_timeout_s: float = Field(
        default=10.0,
        ge=0,
        description="PostgreSQL: the most one database operation (connecting, a statement, a commit, "
        "waiting for a pooled connection) may take, client side, also when the server hangs; then it fails "
        "(the admin API answers 503 `database_unavailable`). The server's `statement_timeout` is 80 % of it. "
        "0: unbounded.",
    )
    redis_url: str | None = Field(
        default=None,
        description="Redis URL for rate limits, load locks and replica state. Default: in memory.",
    )
    redis_prefix: str = Field(default="loraplane:", description="Prefix of every Redis key we write.")
    redis_socket_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="The most one Redis command may wait for its answer (a hung Redis, SIGSTOP'd or "
        "partitioned, answers nothing): then it fails and the caller falls back (cluster state per "
        "process, ratelimit_on_error for limits).",
    )
    redis_connect_timeout_s: float = Field(
        default=1.0,
        gt=0,
        description="The most opening a new connection to Redis may take (a TCP connect that nothing "
        "accepts).",
    )
    admin_token: SecretStr | None = Field(
        default=None, description="Bearer token of the admin API. `loraplane up` generates one if unset."
    )
    log_level: str = Field(default="INFO", description="Log level.")
    log_json: bool = Field(default=True, description="Structured JSON logs (one object per line).")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file_source = InitSettingsSource(settings_cls, init_kwargs=_config_file_values())
        return (init_settings, env_settings, dotenv_settings, file_source, file_secret_settings)

    def resolved_database_url(self) -> str:
        """The configured database URL, or the embedded SQLite file under ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'loraplane.db').resolve()}"
