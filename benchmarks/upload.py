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
throughput ≥ 0.9 × boto3 configured like the registry. ``--separate-s3-cpu`` gives the S3 server
a CPU of its own (as an object store on its own machine). Usage::

    .venv/bin/python benchmarks/upload.py --size-mb 256
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
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
    s3: S3Server, bucket: str, workdir: Path, part: int, max_bytes: int, inflight: int
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
        LORAPLANE_S3_MAX_INFLIGHT_PARTS=str(inflight),
        LORAPLANE_STORAGE_SWEEP_INTERVAL_S="0",
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


def raw_boto3(
    s3: S3Server, bucket: str, path: Path, part: int, *, sign_payload: bool = True, concurrency: int = 10
) -> float:
    """``upload_file`` with boto3's defaults (``sign_payload``: SHA-256 of every part over plain
    http; 10 threads), or configured like the registry's client (unsigned payload, CRC32 checksums
    only; as many parts in flight as the registry)."""
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
    cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=concurrency)
    key = f"raw/{uuid.uuid4().hex}"
    t0 = time.perf_counter()
    client.upload_file(str(path), bucket, key, Config=cfg)
    dt = time.perf_counter() - t0
    client.delete_object(Bucket=bucket, Key=key)
    return dt


def tensor_count(weights: Path) -> int:
    with open(weights, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return len([k for k in header if k != "__metadata__"])


def start_py_spy(pid: int, out: Path, mode: str = "all") -> subprocess.Popen[bytes]:
    """py-spy (``pip install py-spy``) sampling ``pid`` until SIGINT, collapsed stacks to ``out``
    (``gil``: only the thread holding the GIL, where Python code runs; ``native``: C frames too)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [exe, "record", "--pid", str(pid), "--rate", "250", "--threads"]
    argv += {"all": ["--nonblocking"], "gil": ["--nonblocking", "--gil"], "native": ["--native"]}[mode]
    spy = subprocess.Popen([*argv, "--format", "raw", "--output", str(out)], stdout=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the upload starts
    return spy


def delete_version(s3: S3Server, bucket: str, storage_uri: str) -> None:
    prefix = storage_uri.split(f"s3://{bucket}/", 1)[1]
    client = s3.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=o["Key"])


# A 70B-class model's attention projections (hidden 8192, 8 KV heads of 128): a rank-128 LoRA on
# q/k/v/o over 80 layers is about 1 GiB in F16, in 640 tensors.
BENCH_SHAPES = {
    "q_proj": [8192, 8192],
    "k_proj": [8192, 1024],
    "v_proj": [8192, 1024],
    "o_proj": [8192, 8192],
}


def bench_base_model() -> dict[str, Any]:
    return {
        "name": "bench-base",
        "hf_id": "loraplane/bench-base",
        "max_lora_rank": 128,
        "target_modules": list(BENCH_SHAPES),
        "module_shapes": BENCH_SHAPES,
    }


def make_adapter(workdir: Path, size_mb: int, layout: str) -> tuple[Path, dict[str, Any]]:
    """(adapter dir, base model body). ``realistic``: rank 128 on q/k/v/o of a 70B-class model,
    as many layers as reach the size (82 layers ≈ 1 GiB, 8 tensors per layer); ``padded``: the
    demo base's tiny shapes padded with thousands of 64 KiB tensor pairs (32,776 tensors for
    1 GiB), which makes the header, and its validation, as large as it gets."""
    if layout == "padded":
        return write_adapter(workdir / "adapter", rank=64, pad_bytes=size_mb * MB), demo_base_model()
    rank = 128
    per_layer = sum(rank * (i + o) * 2 for i, o in BENCH_SHAPES.values())
    layers = max(1, round(size_mb * MB / per_layer))
    path = write_adapter(
        workdir / "adapter",
        rank=rank,
        target_modules=tuple(BENCH_SHAPES),
        module_shapes=BENCH_SHAPES,
        layers=layers,
        base_model_name_or_path="loraplane/bench-base",
    )
    return path, bench_base_model()


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) a process has used so far; this process when ``pid`` is None."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by this process (the HTTP client, or boto3), the registry and the S3
    server during one measurement: on a small machine they share the cores."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids
        self.start = {k: cpu_s(p) for k, p in pids.items()}

    def stop(self) -> dict[str, float]:
        return {k: round(cpu_s(p) - self.start[k], 2) for k, p in self.pids.items()}


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def separate_s3_cpu(s3_pid: int, registry_pid: int) -> dict[str, list[int]]:
    """The S3 server on the last CPU, everything else (this client, the registry) on the others:
    a stand-in for an object store on its own machine, the way S3 runs in production."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--separate-s3-cpu needs at least 2 CPUs")
    s3_cpus, rest = {cpus[-1]}, set(cpus[:-1])
    pin_process(s3_pid, s3_cpus)
    pin_process(registry_pid, rest)
    pin_process(os.getpid(), rest)
    return {"s3_server": sorted(s3_cpus), "client_and_registry": sorted(rest)}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="adapter size in MiB (default 1024)")
    ap.add_argument("--part-mb", type=int, default=16, help="S3 multipart part size in MiB (default 16)")
    ap.add_argument(
        "--inflight",
        type=int,
        default=2,
        help="parts in flight: LORAPLANE_S3_MAX_INFLIGHT_PARTS of the registry and max_concurrency of "
        "the like-for-like boto3 row (default 2, the registry's default)",
    )
    ap.add_argument("--layout", choices=["realistic", "padded"], default="realistic", help="see make_adapter")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each round runs every kind once")
    ap.add_argument(
        "--separate-s3-cpu",
        action="store_true",
        help="pin the S3 server to the last CPU and the client and registry to the others (an object "
        "store with cores of its own, as in production); default: all share every CPU",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "upload.json")
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="record the registry process with py-spy during its uploads (collapsed stacks in this file)",
    )
    ap.add_argument(
        "--profile-mode",
        choices=["all", "gil", "native"],
        default="all",
        help="with --profile: every thread (default), only the thread holding the GIL, or with C frames",
    )
    args = ap.parse_args()
    part = args.part_mb * MB

    workdir = Path(tempfile.mkdtemp(prefix="lp-upload-bench-"))
    s3 = start_s3_server(timeout=180)
    proc = None
    try:
        bucket = s3.create_bucket()
        print(f"generating a {args.size_mb} MiB adapter ({args.layout}) …", flush=True)
        adapter, base = make_adapter(workdir, args.size_mb, args.layout)
        files = sorted(adapter.iterdir())
        total = sum(p.stat().st_size for p in files)
        weights = adapter / "adapter_model.safetensors"
        proc, url = start_registry(s3, bucket, workdir, part, max(2 * total, 64 * MB), args.inflight)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=auth, timeout=30) as c:
            assert c.post("/admin/v1/base-models", json=base).status_code == 201
            r = c.post("/admin/v1/adapters", json={"id": "bench", "base_model": base["name"]})
            assert r.status_code == 201, r.text
            if base["name"] != "demo-base":
                assert c.post("/admin/v1/base-models", json=demo_base_model()).status_code == 201
            r = c.post("/admin/v1/adapters", json={"id": "warmup", "base_model": "demo-base"})
            assert r.status_code == 201, r.text
        # warm-up: a small upload initialises the S3 client, thread pool and lazy imports
        small = write_adapter(workdir / "small", rank=8)
        _, v = push(url, "warmup", sorted(small.iterdir()))
        delete_version(s3, bucket, v["storage_uri"])

        kinds = {
            "boto3_defaults": {"sign_payload": True, "concurrency": 10},
            "boto3_unsigned_default_concurrency": {"sign_payload": False, "concurrency": 10},
            "boto3_like_registry": {"sign_payload": False, "concurrency": args.inflight},
        }
        times: dict[str, list[float]] = {k: [] for k in [*kinds, "registry"]}
        ratios: list[float] = []
        cpu: dict[str, list[dict[str, float]]] = {k: [] for k in times}
        assert s3.process is not None and s3.process.pid is not None and proc.pid is not None
        parties: dict[str, int | None] = {"client": None, "registry": proc.pid, "s3_server": s3.process.pid}
        cpu_layout: dict[str, list[int]] | str = "shared"
        if args.separate_s3_cpu:
            cpu_layout = separate_s3_cpu(s3.process.pid, proc.pid)
        rss = []
        load_start = loadavg()
        for i in range(args.repeat):  # interleaved: every round runs each kind once, in turn
            for kind, kw in kinds.items():
                print(f"[{i + 1}/{args.repeat}] {kind} …", flush=True)
                meter = CpuMeter(parties)
                times[kind].append(raw_boto3(s3, bucket, weights, part, **kw))
                cpu[kind].append(meter.stop())
            print(f"[{i + 1}/{args.repeat}] registry upload …", flush=True)
            assert proc.pid is not None
            watch = RssWatch(proc.pid)
            spy = start_py_spy(proc.pid, args.profile, args.profile_mode) if args.profile else None
            meter = CpuMeter(parties)
            dt, v = push(url, "bench", files)
            cpu["registry"].append(meter.stop())
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            rss.append(watch.stop())
            times["registry"].append(dt)
            got = {f["name"]: f["size"] for f in v["files"]}
            assert got == {p.name: p.stat().st_size for p in files}, got
            delete_version(s3, bucket, v["storage_uri"])
            # same round: registry (whole version) vs boto3 like the registry (weights file)
            ratios.append((total / dt) / (weights.stat().st_size / times["boto3_like_registry"][-1]))
        load_end = loadavg()

        def mibs(kind: str, t: float) -> float:
            return (total if kind == "registry" else weights.stat().st_size) / MB / t

        median_mibs = {k: mibs(k, statistics.median(ts)) for k, ts in times.items()}
        rows = {
            k: {
                "seconds": [round(t, 3) for t in ts],
                "mib_per_s_best": round(mibs(k, min(ts)), 1),
                "mib_per_s_median": round(mibs(k, statistics.median(ts)), 1),
                "cpu_s": cpu[k],
            }
            for k, ts in times.items()
        }
        ratio = {k: round(median_mibs["registry"] / median_mibs[k], 3) for k in kinds}
        growth = max(r["growth_mb"] for r in rss)
        result = {
            "size_bytes": total,
            "layout": args.layout,
            "tensors": tensor_count(weights),
            "part_bytes": part,
            "inflight_parts": args.inflight,
            "repeat": args.repeat,
            "rows": rows,
            "throughput_ratio_median": ratio,
            "throughput_ratio_like_for_like_per_round": [round(r, 3) for r in ratios],
            "throughput_ratio_like_for_like_median_of_rounds": round(statistics.median(ratios), 3),
            "registry_rss": rss,
            "rss_growth_mb": growth,
            "targets": {"rss_growth_mb_lt": 100, "throughput_ratio_like_for_like_ge": 0.9},
            "met": {"rss": growth < 100, "throughput": ratio["boto3_like_registry"] >= 0.9},
            "machine": {"cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": load_end},
            "cpu_layout": cpu_layout,
        }
        print()
        print(f"{'path':<44}{'best s':>9}{'median s':>10}{'MiB/s med':>11}{'ratio':>8}")
        labels = {
            "registry": "admin API → S3 (registry)",
            "boto3_defaults": "boto3 defaults (signed, 10 threads)",
            "boto3_unsigned_default_concurrency": "boto3 unsigned, 10 threads",
            "boto3_like_registry": f"boto3 like the registry (unsigned, {args.inflight})",
        }
        for k, ts in times.items():
            col = "" if k == "registry" else f"{ratio[k]:>8.2f}"
            med = statistics.median(ts)
            print(f"{labels[k]:<44}{min(ts):>9.2f}{med:>10.2f}{median_mibs[k]:>11.1f}{col}")
        for k in times:
            used = {p: statistics.median(x[p] for x in cpu[k]) for p in parties}
            print(f"  CPU s (median) during {k}: " + ", ".join(f"{p} {v:.2f}" for p, v in used.items()))
        per_round = result["throughput_ratio_like_for_like_per_round"]
        print(
            f"registry / boto3 like the registry, per round: {per_round}, median "
            f"{statistics.median(ratios):.2f} (target ≥ 0.90)"
        )
        print(f"registry RSS growth {growth:.1f} MB (target < 100 MB; baseline {rss[0]['baseline_mb']} MB)")
        print(f"load average at start {load_start}, at end {load_end} ({os.cpu_count()} CPUs)")
        print(f"CPUs: {cpu_layout}")
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
