"""Publishing to S3 (a ray-serve pool's ``staging.mode: publish``) on the real S3 server: the
verified files land under ``<prefix><lora_name>/``, a version whose stored bytes do not match its
sha256 leaves nothing published, and unpublishing removes the folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit import localservices as ls
from registry.storage.local import LocalArtifactStore
from router.publish import S3Publisher
from router.settings import StagingConfig
from router.staging import HashMismatch
from tests.router.routerkit import put_version


def _publisher(s3: ls.S3Server, bucket: str, store: LocalArtifactStore) -> S3Publisher:
    cfg = StagingConfig(
        mode="publish",
        uri=f"s3://{bucket}/loras/",
        endpoint_url=s3.endpoint_url,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,  # type: ignore[arg-type]
        region=s3.region,
    )
    return S3Publisher(cfg, store)


def _keys(s3: ls.S3Server, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket).get("Contents", []))


async def test_publish_then_unpublish(s3_server: ls.S3Server, s3_bucket: str, tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "artifacts")
    v = put_version(store, tmp_path, "pub", seed=1)
    pub = _publisher(s3_server, s3_bucket, store)
    where = await pub.stage("http://ray:8000", "ray", v)
    assert where == f"s3://{s3_bucket}/loras/{v.lora_name}"
    assert _keys(s3_server, s3_bucket) == [
        f"loras/{v.lora_name}/adapter_config.json",
        f"loras/{v.lora_name}/adapter_model.safetensors",
    ]
    got = s3_server.client().get_object(
        Bucket=s3_bucket, Key=f"loras/{v.lora_name}/adapter_model.safetensors"
    )
    weights = next(f for f in v.files if f.name == "adapter_model.safetensors")
    import hashlib

    assert hashlib.sha256(got["Body"].read()).hexdigest() == weights.sha256
    await pub.remove("ray", v.lora_name)
    assert _keys(s3_server, s3_bucket) == []


async def test_tampered_artifact_publishes_nothing(
    s3_server: ls.S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    store = LocalArtifactStore(tmp_path / "artifacts")
    v = put_version(store, tmp_path, "bad", seed=2)
    uri = v.storage_uri.removeprefix("file://")
    (Path(uri) / "adapter_model.safetensors").write_bytes(b"tampered")
    with pytest.raises(HashMismatch):
        await _publisher(s3_server, s3_bucket, store).stage("http://ray:8000", "ray", v)
    assert _keys(s3_server, s3_bucket) == []  # neither the weights nor (never written) the config
