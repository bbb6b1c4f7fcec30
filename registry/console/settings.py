"""Typed settings of the admin console (env prefix ``LORAPLANE_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from kit.settings import LoraplaneSettings


class ConsoleSettings(LoraplaneSettings):
    console_secret: SecretStr | None = Field(
        default=None,
        description="Signs console session cookies, together with the admin token when there is "
        "one (rotating the token signs everyone out); share it between admin API processes.",
    )
    console_secure_cookies: bool = Field(
        default=False,
        description="Mark console cookies Secure (set it when the console is served over HTTPS).",
    )
    console_session_ttl_s: int = Field(default=8 * 3600, ge=60, description="Console sign-in lifetime.")
    console_traffic_interval_s: float = Field(
        default=10.0, gt=0, description="Traffic page sampling interval; one hour of samples is kept."
    )
