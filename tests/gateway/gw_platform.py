"""Test-only: the whole platform as real processes for end-to-end gateway tests.

PostgreSQL (a fresh database), Redis (a unique prefix), S3 (SeaweedFS), two simulator replicas,
one ``loraplane serve --role registry`` process and two ``loraplane serve --role gateway``
processes sharing Redis, PostgreSQL and a staging directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit import localservices as ls
from kit.procs import ManagedProcess, http_ready, wait_all_ready
from kit.procs import stop_all as stop_procs
from registry.adapter_factory import write_adapter
from registry.admin_client import AdminClient
from registry.demo import demo_base_model
from simulator.procs import SimProcess

ADMIN_TOKEN = "e2e-admin-token-0123456789abcdef"


@dataclass
class Platform:
    admin_url: str
    gateway_urls: list[str]
    admin: AdminClient
    workdir: Path
    procs: list[ManagedProcess] = field(default_factory=list)  # the registry, then each gateway
    keys: dict[str, str] = field(default_factory=dict)
    sim_urls: list[str] = field(default_factory=list)
    sims: list[SimProcess] = field(default_factory=list)  # the replicas' processes (fault tests signal them)
    database_url: str = ""  # the registry's PostgreSQL database (tests read its revision)
    # each gateway's internal port (SPEC §19): /metrics and the detailed /readyz, in gateway_urls' order
    internal_urls: list[str] = field(default_factory=list)

    def internal(self, gateway_url: str) -> str:
        """The internal port's URL of the gateway serving ``gateway_url``."""
        return self.internal_urls[self.gateway_urls.index(gateway_url)]

    bucket: str = ""  # the platform's S3 bucket (artifacts; a ray-serve pool publishes under published/)
    engine: str = "vllm"  # what the simulated replicas speak

    def upload(self, adapter_id: str, seed: int) -> str:
        d = self.workdir / f"src-{adapter_id}-{seed}"
        write_adapter(d, seed=seed, rank=8, target_modules=("q_proj", "v_proj"))
        return str(self.admin.upload_version(adapter_id, d)["version"])

    def adapter(self, adapter_id: str, versions: int = 1, promote: str | None = "v1") -> None:
        self.admin.create_adapter(adapter_id, "demo-base", owner="e2e")
        for i in range(versions):
            self.upload(adapter_id, seed=hash(adapter_id) % 1000 + i)
        if promote:
            self.admin.promote(adapter_id, promote)


@contextlib.contextmanager
def run_platform(
    s3: ls.S3Server,
    redis_url: str,
    *,
    gateways: int = 2,
    sims: int = 2,
    sim_args: Sequence[str] = ("--zero-latency",),
    env: Mapping[str, str] | None = None,
    pool: Mapping[str, Any] | None = None,
    pg_base: str | None = None,
    engine: str = "vllm",
) -> Iterator[Platform]:
    """The platform; ``sim_args`` are the simulators' flags, ``env`` extra settings of every
    ``loraplane serve`` process, ``pool`` overrides of the replica pool's config, ``pg_base`` the
    PostgreSQL server to make the database on (default: the suite's), ``engine`` the engine the
    simulated replicas speak (the pool's ``engine``; ``ray-serve`` publishes to the bucket)."""
    from registry import migrate
    from simulator.procs import start_simulators, stop_all

    workdir = Path(tempfile.mkdtemp(prefix="lp-gwe2e-"))
    prefix = ls.unique_redis_prefix("gwe2e")
    bucket = s3.create_bucket()
    sim_procs: list[SimProcess] = []
    procs: list[ManagedProcess] = []
    with ls.temp_pg_database("gwe2e", base=pg_base) as pg:
        migrate.upgrade(pg)
        try:
            engine_args, sim_env, engine_pool = engine_setup(engine, s3, bucket)
            sim_procs = start_simulators(
                sims, extra_args=[*sim_args, *engine_args], engine=engine, env=sim_env
            )
            admin_port = ls.free_port()
            gw_ports = [ls.free_port() for _ in range(gateways)]
            internal_ports = [ls.free_port() for _ in range(gateways)]
            base_env = {
                **os.environ,
                "LORAPLANE_DATABASE_URL": pg,
                "LORAPLANE_REDIS_URL": redis_url,
                "LORAPLANE_REDIS_PREFIX": prefix,
                "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN,
                "LORAPLANE_S3_BUCKET": bucket,
                "LORAPLANE_S3_ENDPOINT_URL": s3.endpoint_url,
                "LORAPLANE_S3_ACCESS_KEY_ID": s3.access_key,
                "LORAPLANE_S3_SECRET_ACCESS_KEY": s3.secret_key,
                "LORAPLANE_S3_REGION": s3.region,
                "LORAPLANE_DATA_DIR": str(workdir / "data"),
                "LORAPLANE_STAGING_DIR": str(workdir / "staging"),
                "LORAPLANE_POOLS": json.dumps(
                    [
                        {
                            "name": "sim",
                            "base_model": "demo-base",
                            "urls": [p.url for p in sim_procs],
                            "max_loras": 4,
                            "max_adapters": 8,
                            **engine_pool,
                            **(pool or {}),
                        }
                    ]
                ),
                "LORAPLANE_POLL_INTERVAL_S": "0.25",
                "LORAPLANE_LOG_LEVEL": "WARNING",
                "LORAPLANE_ADMIN_PORT": str(admin_port),
                **(env or {}),
            }
            roles: list[tuple[str, dict[str, str]]] = [("registry", {})] + [
                ("gateway", {"LORAPLANE_GATEWAY_PORT": str(p), "LORAPLANE_GATEWAY_INTERNAL_PORT": str(ip)})
                for p, ip in zip(gw_ports, internal_ports, strict=True)
            ]
            for i, (role, extra) in enumerate(roles):
                argv = [sys.executable, "-m", "loraplane.cli", "serve", "--role", role]
                log = workdir / f"{role}-{i}.log"
                procs.append(
                    ManagedProcess(argv, env={**base_env, **extra}, log_path=log, name=f"{role}-{i}").start()
                )
            admin_url = f"http://127.0.0.1:{admin_port}"
            gw_urls = [f"http://127.0.0.1:{p}" for p in gw_ports]
            internal_urls = [f"http://127.0.0.1:{p}" for p in internal_ports]
            procs[0].wait_ready(http_ready(f"{admin_url}/admin/v1/healthz"), 90)
            admin = AdminClient(admin_url, ADMIN_TOKEN)
            spec = demo_base_model()
            admin.create_base_model(
                spec["name"],
                spec["hf_id"],
                spec["max_lora_rank"],
                spec["target_modules"],
                spec["module_shapes"],
            )
            wait_all_ready(
                [(p, http_ready(f"{u}/readyz")) for p, u in zip(procs[1:], gw_urls, strict=True)], 90
            )
            yield Platform(
                admin_url,
                gw_urls,
                admin,
                workdir,
                procs,
                sim_urls=[p.url for p in sim_procs],
                sims=sim_procs,
                database_url=pg,
                internal_urls=internal_urls,
                bucket=bucket,
                engine=engine,
            )
            admin.close()
        finally:
            stop_procs(procs, grace_s=10)
            stop_all(sim_procs)
            with contextlib.suppress(Exception):  # a fault test may leave its own Redis stopped
                ls.flush_redis_prefix(redis_url, prefix)
            if os.environ.get("LORAPLANE_TEST_SHOW_LOGS"):
                for p in procs:
                    print(p.log_path.name, p.log_tail())


def engine_setup(
    engine: str, s3: ls.S3Server, bucket: str
) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """(simulator flags, simulator env, pool fields) of the simulated ``engine`` (a pool of
    ``max_adapters`` 8: SGLang's --max-loaded-loras and TensorRT-LLM's host cache match it; a Ray
    Serve app reads what the router publishes under ``s3://<bucket>/published/``)."""
    if engine == "sglang":
        return ["--max-loaded-loras", "8"], {}, {"engine": engine}
    if engine == "trtllm":
        return ["--max-cpu-loras", "8"], {}, {"engine": engine}
    if engine == "ray-serve":
        uri = f"s3://{bucket}/published/"
        env = {
            "AWS_ENDPOINT_URL": s3.endpoint_url,
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_DEFAULT_REGION": s3.region,
        }
        staging = {
            "mode": "publish",
            "uri": uri,
            "endpoint_url": s3.endpoint_url,
            "access_key_id": s3.access_key,
            "secret_access_key": s3.secret_key,
            "region": s3.region,
        }
        return ["--dynamic-lora-loading-path", uri], env, {"engine": engine, "staging": staging}
    return [], {}, {}
