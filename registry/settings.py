"""Typed settings of the registry (admin API). Env prefix ``LORAPLANE_``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from kit.settings import LoraplaneSettings


class RegistrySettings(LoraplaneSettings):
    admin_host: str = Field(default="127.0.0.1", description="Admin API bind address.")
    admin_port: int = Field(default=8081, description="Admin API port.")
    artifact_dir: Path | None = Field(
        default=None, description="Local artifact store directory (default: data_dir/artifacts)."
    )
    s3_bucket: str | None = Field(default=None, description="Setting this switches artifacts to S3.")
    s3_prefix: str = Field(default="loraplane/", description="Key prefix inside the bucket.")
    s3_endpoint_url: str | None = Field(default=None, description="S3 endpoint (MinIO, SeaweedFS, …).")
    s3_region: str = Field(default="us-east-1", description="S3 region.")
    s3_access_key_id: str | None = Field(default=None, description="S3 access key (else boto3's chain).")
    s3_secret_access_key: SecretStr | None = Field(default=None, description="S3 secret key.")
    s3_multipart_chunk_bytes: int = Field(default=16 * 1024 * 1024, description="S3 multipart part size.")
    s3_max_inflight_parts: int = Field(
        default=2,
        ge=1,
        le=16,
        description="Parts of one file uploaded at once while it streams in (memory: this × part size).",
    )
    storage_orphan_age_s: float = Field(
        default=3600,
        gt=0,
        description="The orphan sweeper removes unfinished S3 multipart uploads and version locations "
        "no version row names once they are this old (what a failed or killed upload left behind).",
    )
    storage_sweep_interval_s: float = Field(
        default=3600,
        ge=0,
        description="How often the admin API sweeps the artifact store for orphans (also once at "
        "start-up); 0 turns the sweeper off.",
    )
    allowed_sources: list[str] = Field(
        default_factory=list,
        description="Prefixes that `source_uri` registration may read from, and Hugging Face repositories "
        '(glob patterns) it may import, e.g. ["s3://bucket/adapters/", "hf://my-org/*"].',
    )
    hf_endpoint: str | None = Field(
        default=None,
        description="Hugging Face Hub endpoint for `hf://` imports (a mirror or proxy); unset: the "
        "`HF_ENDPOINT` environment variable, else https://huggingface.co.",
    )
    hf_token: SecretStr | None = Field(
        default=None,
        description="Token for `hf://` imports of private or gated repositories (never logged); unset: "
        "anonymous (a token cached by `hf auth login` or `HF_TOKEN` is not used).",
    )
    hf_timeout_s: float = Field(
        default=30.0, gt=0, description="Timeout of each request to the Hugging Face Hub (connect and read)."
    )
    max_adapter_bytes: int = Field(
        default=2 * 1024**3, description="Cap on the total bytes of one version (413 above it)."
    )
    promotion_ttl_s: float = Field(
        default=7 * 24 * 3600,
        gt=0,
        description="How long a promotion request waits for its approvals before it expires (SPEC §14).",
    )
    feed_poll_interval_s: float = Field(
        default=0.05, description="Polling fallback of the change feed (SQLite across processes)."
    )

    def resolved_artifact_dir(self) -> Path:
        return (self.artifact_dir or (self.data_dir / "artifacts")).resolve()
