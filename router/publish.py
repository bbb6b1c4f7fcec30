"""Publishing: the "load" of an engine that loads adapters by name from a store (``lazy_by_name``;
Ray Serve LLM's ``dynamic_lora_loading_path``).

A version is published under its immutable name, ``<uri>/<lora_name>/<file>``, the folder
layout the engine reads (the folder name is the adapter id). Every file is streamed from the
artifact store and its sha256 checked on the way; the objects are written weights first and
``adapter_config.json`` last, so the engine (which looks for the config first) never sees a
folder whose files are not all there; a file that does not match deletes what was written and
raises :class:`HashMismatch` (nothing of it stays published). Every load publishes again from the
verified artifact (SPEC §10: the hash is checked before every load).

``remove`` unpublishes (the config first, so the folder stops being servable at once): the
unloader does it when the version is retired or disabled — never on an eviction, since the
engine reloads a published name by itself.

Targets: ``s3://bucket/prefix/`` (boto3), or ``file:///dir`` (a directory: what simulated
replicas read; a real Ray Serve LLM only reads s3://, gs://, abfss:// or azure://).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, BinaryIO

from registry.snapshot import CONFIG_FILE, VersionInfo
from router.settings import StagingConfig
from router.staging import CHUNK, HashMismatch, ReadableStore, StagingError, check_names


class _HashingReader:
    """A file-like over an artifact stream that hashes what is read (for ``upload_fileobj``)."""

    def __init__(self, src: BinaryIO) -> None:
        self._src = src
        self.sha = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        try:
            chunk = self._src.read(size if size and size > 0 else CHUNK)
        except Exception as exc:  # the store's errors, translated at this boundary
            raise StagingError(f"reading from the artifact store failed: {exc}") from exc
        self.sha.update(chunk)
        return chunk


class S3Publisher:
    """Publishes verified files under ``s3://bucket/prefix/<lora_name>/``."""

    def __init__(self, cfg: StagingConfig, store: ReadableStore, client: Any = None) -> None:
        uri = cfg.uri or ""
        if not uri.startswith("s3://"):
            raise ValueError(f"not an s3:// publish target: {uri!r}")
        bucket, _, prefix = uri[5:].partition("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._store = store
        self._client = client if client is not None else _client(cfg)
        self._locks: dict[str, asyncio.Lock] = {}

    def key(self, lora_name: str, file: str = "") -> str:
        return f"{self.prefix}{lora_name}/{file}"

    async def stage(self, replica_url: str, host: str, version: VersionInfo) -> str:
        check_names(version)
        async with self._locks.setdefault(version.lora_name, asyncio.Lock()):
            await asyncio.to_thread(self._publish, version)
        return f"s3://{self.bucket}/{self.key(version.lora_name).rstrip('/')}"

    def _publish(self, version: VersionInfo) -> None:
        files = sorted(version.files, key=lambda f: f.name == CONFIG_FILE)  # the config last
        written: list[str] = []
        try:
            for f in files:
                try:
                    src = self._store.open_read(version.storage_uri, f.name)
                except Exception as exc:
                    raise StagingError(f"cannot read {f.name} from the artifact store: {exc}") from exc
                key = self.key(version.lora_name, f.name)
                with src:
                    reader = _HashingReader(src)
                    try:
                        self._client.upload_fileobj(reader, self.bucket, key)
                    except StagingError:
                        raise
                    except Exception as exc:  # botocore's errors
                        raise StagingError(
                            f"cannot publish {f.name} to s3://{self.bucket}/{key}: {exc}"
                        ) from exc
                written.append(key)
                actual = reader.sha.hexdigest()
                if actual != f.sha256:
                    raise HashMismatch(f.name, f.sha256, actual)
        except BaseException:
            self._delete(reversed(written))
            raise

    def _delete(self, keys: Any) -> None:
        for key in keys:
            try:
                self._client.delete_object(Bucket=self.bucket, Key=key)
            except Exception:
                continue

    async def remove(self, host: str, lora_name: str) -> None:
        async with self._locks.setdefault(lora_name, asyncio.Lock()):
            await asyncio.to_thread(self._unpublish, lora_name)

    def _unpublish(self, lora_name: str) -> None:
        try:
            listed = self._client.list_objects_v2(Bucket=self.bucket, Prefix=self.key(lora_name))
        except Exception as exc:
            raise StagingError(f"cannot list s3://{self.bucket}/{self.key(lora_name)}: {exc}") from exc
        keys = [o["Key"] for o in listed.get("Contents", [])]
        keys.sort(key=lambda k: not k.endswith("/" + CONFIG_FILE))  # the config first
        self._delete(keys)


def _client(cfg: StagingConfig) -> Any:
    import boto3
    from botocore.config import Config

    secret = cfg.secret_access_key.get_secret_value() if cfg.secret_access_key else None
    return boto3.client(
        "s3",
        endpoint_url=cfg.endpoint_url,
        region_name=cfg.region,
        aws_access_key_id=cfg.access_key_id,
        aws_secret_access_key=secret,
        config=Config(
            s3={"addressing_style": "path"} if cfg.endpoint_url else {},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
        ),
    )
