"""Typed settings of the evaluator (SPEC §16). Env prefix ``LORAPLANE_``."""

from __future__ import annotations

from pydantic import Field

from kit.settings import LoraplaneSettings


class EvaluatorSettings(LoraplaneSettings):
    eval_gateway_url: str | None = Field(
        default=None,
        description="Gateway the evaluator sends cases through (its /v1 API). Unset: the process's own "
        "gateway under `loraplane serve --role all` and `loraplane up`; `serve --role registry` needs it.",
    )
    eval_concurrency: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Requests one evaluation has in flight at most (live traffic keeps its latency).",
    )
    eval_seed: int = Field(
        default=0, description="The `seed` of every evaluation request (temperature is 0)."
    )
    eval_max_tokens: int = Field(default=256, ge=1, description="`max_tokens` of a case that sets none.")
    eval_request_timeout_s: float = Field(
        default=120.0, gt=0, description="Timeout of one evaluation request."
    )
    eval_stale_s: float = Field(
        default=60.0,
        gt=0,
        description="A running evaluation whose process has not reported for this long (it was killed or "
        "restarted) is marked failed, at start-up and by a periodic check.",
    )
    eval_key_wait_s: float = Field(
        default=15.0, gt=0, description="How long a run waits for the gateway to accept its fresh tenant key."
    )

    eval_in_process: bool = Field(
        default=True,
        description="The admin API process runs the evaluations it starts. false: it only records them "
        "and `loraplane serve --role evaluator` processes pick them up.",
    )
    eval_max_runs: int = Field(
        default=2, ge=1, le=64, description="Evaluations one `serve --role evaluator` process runs at once."
    )

    def gateway_url(self) -> str | None:
        return self.eval_gateway_url.rstrip("/") if self.eval_gateway_url else None
