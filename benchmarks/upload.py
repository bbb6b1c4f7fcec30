"""Upload benchmark: a large adapter through the admin API to S3, next to a raw boto3 upload.

Starts a SeaweedFS S3 server (``kit.localservices``), runs the admin API (``create_admin_app``
under uvicorn, S3 backend, SQLite) in a subprocess, registers a base model and an adapter,
generates a valid adapter of ``--size-mb`` (default 1024) with ``registry.adapter_factory``,
and measures:

- ``registry``: a streaming multipart client (file read and sent in 1 MiB chunks) pushing it
  through ``POST /admin/v1/adapters/{id}/versions`` (parse, hash, validate, multipart to S3);
- ``boto3``: ``upload_file`` of the same weights file to the same server with the same part
  size, once with boto3's defaults (which SHA-256-sign every part on a plain-http endpoint) and
  once configured like the registry's own client (``payload_signing_enabled=False``: CRC32
  checksums only; the registry hashes every file with SHA-256 on the way in anyway);
- the registry process's peak RSS growth during the upload (``VmHWM`` after resetting it
  through ``/proc/<pid>/clear_refs``, plus ``VmRSS`` sampling every 20 ms).

Prints a table and writes ``benchmarks/results/upload.json``. Targets: RSS growth < 100 MB,
throughput ≥ 80 % of raw boto3. Usage::

    .venv/bin/python benchmarks/upload.py --size-mb 256
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from kit.localservices import S3Server, start_s3_server
from kit.procs import ManagedProcess, free_port, http_ready
from registry import migrate
from registry.adapter_factory import write_adapter
from registry.demo import demo_base_model

ROOT = Path(__file__).resolve().parent
MB = 1024 * 1024
TOKEN = "bench-" + uuid.uuid4().hex
BOUNDARY = "lpbench" + uuid.uuid4().hex[:12]

SERVER = """
import uvicorn
from registry.api import create_admin_app
from registry.settings import RegistrySettings
uvicorn.run(create_admin_app(RegistrySettings()), host="127.0.0.1", port={port}, log_level="warning")
"""


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


class RssWatch:
    """Samples VmRSS of a process until stopped; also reads VmHWM (peak) after resetting it."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid = pid
        self.interval = interval
        self.baseline = rss_kb(pid)
        self.hwm_reset = False
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            self.hwm_reset = True
        except OSError:
            pass
        self.peak = self.baseline
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.peak = max(self.peak, rss_kb(self.pid))
            except (OSError, RuntimeError):
                return

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._t.join(timeout=2)
        hwm = rss_kb(self.pid, "VmHWM") if self.hwm_reset else 0
        peak = max(self.peak, hwm)
        return {
            "baseline_mb": round(self.baseline / 1024, 1),
            "peak_mb": round(peak / 1024, 1),
            "growth_mb": round((peak - self.baseline) / 1024, 1),
            "hwm_reset": self.hwm_reset,
        }


def multipart_stream(files: list[Path], chunk: int = MB) -> tuple[int, Iterator[bytes]]:
    """(content length, body iterator) of a multipart/form-data body read from disk."""
    heads = [
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="{p.name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        for p in files
    ]
    tail = f"--{BOUNDARY}--\r\n".encode()
    length = sum(len(h) + p.stat().st_size + 2 for h, p in zip(heads, files, strict=True)) + len(tail)

    def gen() -> Iterator[bytes]:
        for h, p in zip(heads, files, strict=True):
            yield h
            with open(p, "rb") as f:
                while data := f.read(chunk):
                    yield data
            yield b"\r\n"
        yield tail

    return length, gen()


def start_registry(
    s3: S3Server, bucket: str, workdir: Path, part: int, max_bytes: int
) -> tuple[ManagedProcess, str]:
    db = workdir / "registry.db"
    migrate.upgrade(f"sqlite:///{db}")
    port = free_port()
    env = dict(
        os.environ,
        LORAPLANE_DATA_DIR=str(workdir / "data"),
        LORAPLANE_DATABASE_URL=f"sqlite:///{db}",
        LORAPLANE_ADMIN_TOKEN=TOKEN,
        LORAPLANE_S3_BUCKET=bucket,
        LORAPLANE_S3_PREFIX="bench/",
        LORAPLANE_S3_ENDPOINT_URL=s3.endpoint_url,
        LORAPLANE_S3_ACCESS_KEY_ID=s3.access_key,
        LORAPLANE_S3_SECRET_ACCESS_KEY=s3.secret_key,
        LORAPLANE_S3_REGION=s3.region,
        LORAPLANE_S3_MULTIPART_CHUNK_BYTES=str(part),
        LORAPLANE_MAX_ADAPTER_BYTES=str(max_bytes),
        LORAPLANE_LOG_LEVEL="WARNING",
    )
    argv = [sys.executable, "-c", SERVER.format(port=port)]
    proc = ManagedProcess(argv, env=env, log_path=workdir / "registry.log", name="registry").start()
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_ready(http_ready(f"{url}/admin/v1/healthz", timeout=1.0), 600)
    except BaseException:
        proc.stop()
        raise
    return proc, url


def push(url: str, adapter_id: str, files: list[Path]) -> tuple[float, dict[str, Any]]:
    length, body = multipart_stream(files)
    headers = {
        "Authorization": f"Bearer {TOKEN}",
        "content-type": f"multipart/form-data; boundary={BOUNDARY}",
        "content-length": str(length),
    }
    t0 = time.perf_counter()
    with httpx.Client(timeout=httpx.Timeout(600, connect=10)) as c:
        r = c.post(f"{url}/admin/v1/adapters/{adapter_id}/versions", content=body, headers=headers)
    dt = time.perf_counter() - t0
    if r.status_code != 201:
        raise RuntimeError(f"upload failed: {r.status_code} {r.text[:2000]}")
    return dt, r.json()


def raw_boto3(s3: S3Server, bucket: str, path: Path, part: int, *, sign_payload: bool = True) -> float:
    """``upload_file`` with boto3's defaults (``sign_payload``: SHA-256 of every part over plain
    http), or configured like the registry's client (unsigned payload, CRC32 checksums only)."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        region_name=s3.region,
        config=Config(
            s3={"addressing_style": "path", **({} if sign_payload else {"payload_signing_enabled": False})},
            retries={"max_attempts": 5, "mode": "standard"},
            read_timeout=600,
            max_pool_connections=16,
        ),
    )
    cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part)
    key = f"raw/{uuid.uuid4().hex}"
    t0 = time.perf_counter()
    client.upload_file(str(path), bucket, key, Config=cfg)
    dt = time.perf_counter() - t0
    client.delete_object(Bucket=bucket, Key=key)
    return dt


def delete_version(s3: S3Server, bucket: str, storage_uri: str) -> None:
    prefix = storage_uri.split(f"s3://{bucket}/", 1)[1]
    client = s3.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=o["Key"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="adapter size in MiB (default 1024)")
    ap.add_argument("--part-mb", type=int, default=16, help="S3 multipart part size in MiB (default 16)")
    ap.add_argument("--repeat", type=int, default=1, help="measurements of each kind (best is reported)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "upload.json")
    args = ap.parse_args()
    part = args.part_mb * MB

    workdir = Path(tempfile.mkdtemp(prefix="lp-upload-bench-"))
    s3 = start_s3_server(timeout=180)
    proc = None
    try:
        bucket = s3.create_bucket()
        print(f"generating a {args.size_mb} MiB adapter …", flush=True)
        adapter = write_adapter(workdir / "adapter", rank=64, pad_bytes=args.size_mb * MB)
        files = sorted(adapter.iterdir())
        total = sum(p.stat().st_size for p in files)
        weights = adapter / "adapter_model.safetensors"
        proc, url = start_registry(s3, bucket, workdir, part, max(2 * total, 64 * MB))
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=auth, timeout=30) as c:
            assert c.post("/admin/v1/base-models", json=demo_base_model()).status_code == 201
            r = c.post("/admin/v1/adapters", json={"id": "bench", "base_model": "demo-base"})
            assert r.status_code == 201, r.text
        # warm-up: a small upload initialises the S3 client, thread pool and lazy imports
        small = write_adapter(workdir / "small", rank=8)
        _, v = push(url, "bench", sorted(small.iterdir()))
        delete_version(s3, bucket, v["storage_uri"])

        reg_times, raw_times, same_times, rss = [], [], [], []
        for i in range(args.repeat):
            print(f"[{i + 1}/{args.repeat}] raw boto3 upload_file …", flush=True)
            raw_times.append(raw_boto3(s3, bucket, weights, part))
            print(f"[{i + 1}/{args.repeat}] raw boto3 upload_file, unsigned payload …", flush=True)
            same_times.append(raw_boto3(s3, bucket, weights, part, sign_payload=False))
            print(f"[{i + 1}/{args.repeat}] registry upload …", flush=True)
            assert proc.pid is not None
            watch = RssWatch(proc.pid)
            dt, v = push(url, "bench", files)
            rss.append(watch.stop())
            reg_times.append(dt)
            got = {f["name"]: f["size"] for f in v["files"]}
            assert got == {p.name: p.stat().st_size for p in files}, got
            delete_version(s3, bucket, v["storage_uri"])

        reg_best, raw_best, same_best = min(reg_times), min(raw_times), min(same_times)
        reg_mbps = total / MB / reg_best
        raw_mbps = weights.stat().st_size / MB / raw_best
        same_mbps = weights.stat().st_size / MB / same_best
        growth = max(r["growth_mb"] for r in rss)
        result = {
            "size_bytes": total,
            "part_bytes": part,
            "repeat": args.repeat,
            "registry": {"seconds": [round(t, 3) for t in reg_times], "mib_per_s": round(reg_mbps, 1)},
            "boto3_upload_file": {
                "seconds": [round(t, 3) for t in raw_times],
                "mib_per_s": round(raw_mbps, 1),
            },
            "boto3_upload_file_unsigned_payload": {
                "seconds": [round(t, 3) for t in same_times],
                "mib_per_s": round(same_mbps, 1),
            },
            "throughput_ratio": round(reg_mbps / raw_mbps, 3),
            "throughput_ratio_like_for_like": round(reg_mbps / same_mbps, 3),
            "registry_rss": rss,
            "rss_growth_mb": growth,
            "targets": {"rss_growth_mb_lt": 100, "throughput_ratio_ge": 0.8},
            "met": {"rss": growth < 100, "throughput": reg_mbps / raw_mbps >= 0.8},
            "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)},
        }
        print()
        print(f"{'path':<28}{'seconds':>10}{'MiB/s':>10}")
        print(f"{'admin API → S3 (registry)':<28}{reg_best:>10.2f}{reg_mbps:>10.1f}")
        print(f"{'boto3 upload_file (raw)':<28}{raw_best:>10.2f}{raw_mbps:>10.1f}")
        print(f"{'boto3, unsigned payload':<28}{same_best:>10.2f}{same_mbps:>10.1f}")
        print(
            f"throughput ratio {result['throughput_ratio']:.2f} vs boto3's defaults (target ≥ 0.80), "
            f"{result['throughput_ratio_like_for_like']:.2f} vs boto3 configured like the registry"
        )
        print(f"registry RSS growth {growth:.1f} MB (target < 100 MB; baseline {rss[0]['baseline_mb']} MB)")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    finally:
        if proc is not None:
            proc.stop(grace_s=10)
        s3.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
