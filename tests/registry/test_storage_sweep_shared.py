"""The S3 orphan sweep with several registry processes on one bucket (issue 24.21), on the
suite's real S3 server (SeaweedFS): two ``S3ArtifactStore`` instances stand for two registries.

- registry A's multipart upload, open longer than the orphan age, survives registry B's sweep
  (A's upload lease is fresh), and A then finishes and commits it;
- a truly orphaned upload — one a third registry began and then died with (its lease no longer
  renewed), and one with no lease at all — is still swept once the lease went stale, the stale
  lease object with it.
"""

from __future__ import annotations

import os
import time

from kit.localservices import S3Server
from registry.storage import make_store
from registry.storage.s3 import S3ArtifactStore
from registry.storage.s3_leases import lease_key
from tests.registry.test_storage_stores import PART, bucket_keys, open_uploads, s3_settings

ORPHAN_AGE_S = 1.0
RENEW_S = 0.3
TTL_S = 5.0  # well above the first sweep's time, on a busy machine too


class NoRows:
    def __call__(self, candidates: list[str]) -> set[str]:
        return set()


def registry_store(server: S3Server, bucket: str) -> S3ArtifactStore:
    base = make_store(s3_settings(server, bucket))
    assert isinstance(base, S3ArtifactStore)
    base.close()
    return S3ArtifactStore(
        base.client,
        bucket,
        "lp/",
        part_size=PART,
        cleanup_client=base.cleanup_client,
        lease_renew_s=RENEW_S,
        lease_ttl_s=TTL_S,
    )


def test_a_long_upload_of_one_registry_survives_the_sweep_of_another(
    s3_server: S3Server, s3_bucket: str
) -> None:
    a, b, dead = (registry_store(s3_server, s3_bucket) for _ in range(3))
    client = s3_server.client()
    try:
        long_up = a.begin("x")
        w = long_up.writer("adapter_model.safetensors")
        first = os.urandom(PART + 7)
        w.write(first)  # one part sent: a multipart upload is open in S3
        long_key = long_up.key_prefix + "adapter_model.safetensors"

        orphan = dead.begin("y")  # a registry that dies mid-upload: its lease stops being renewed
        ow = orphan.writer("adapter_model.safetensors")
        ow.write(os.urandom(PART + 3))
        orphan_key = orphan.key_prefix + "adapter_model.safetensors"
        dead.leases.stop()
        bare_key = "lp/adapters/z/0123456789abcdef0123456789abcdef/adapter_model.safetensors"
        client.create_multipart_upload(Bucket=s3_bucket, Key=bare_key)  # no lease at all

        time.sleep(ORPHAN_AGE_S + 0.5)  # every upload is older than the orphan age now
        first_sweep = b.sweep(NoRows(), older_than_s=ORPHAN_AGE_S)
        assert first_sweep.uploads_aborted == 1  # the lease-less one only
        assert sorted(open_uploads(s3_server, s3_bucket)) == sorted([long_key, orphan_key])

        time.sleep(TTL_S + 0.5)  # the dead registry's lease is stale; A's is renewed all along
        second = b.sweep(NoRows(), older_than_s=ORPHAN_AGE_S)
        assert second.uploads_aborted == 1
        assert open_uploads(s3_server, s3_bucket) == [long_key]
        keys = bucket_keys(s3_server, s3_bucket)
        assert lease_key("lp/", orphan.key_prefix) not in keys  # the stale lease went too
        assert lease_key("lp/", long_up.key_prefix) in keys

        w.write(b"the rest")  # A's upload finishes after both sweeps and commits
        info = w.close()
        long_up.commit()
        assert info.size == len(first) + len(b"the rest")
        assert a.open_read(long_up.storage_uri, "adapter_model.safetensors").read() == first + b"the rest"
        assert lease_key("lp/", long_up.key_prefix) not in bucket_keys(s3_server, s3_bucket)
    finally:
        for s in (a, b, dead):
            s.close()
