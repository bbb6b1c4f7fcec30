"""Conformance script: run one sequence of requests against ANY vLLM-compatible URL.

Checks status codes, error ``type``s, JSON shapes and SSE framing of models, load/unload,
completions, chat, streaming, metrics, tokenize and auth, and the key sets of every chat and
completions body and stream chunk (recursively, ``simulator.conformance_keys``), as real vLLM
(0.32/0.33, runtime LoRA updating on) answers. Every check is meant to hold for a real vLLM
server and for the simulator alike (nothing simulator-only).

    python -m simulator.conformance URL --model BASE --adapter-dir DIR --bad-rank-dir DIR \\
        [--api-key K] [--json OUT]

``DIR`` is a valid PEFT adapter directory (absolute path, readable by the server);
``--bad-rank-dir`` one whose rank exceeds the server's ``--max-lora-rank``. The exit status is
1 when any check fails. ``run_conformance(...)`` returns the report as a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import httpx

from simulator.conformance_checks import (
    Check,
    Report,
    Runner,
    generation,
    lora_lifecycle,
    metrics,
    probes,
    unload,
)
from simulator.conformance_keys import keysets

__all__ = ["Check", "Report", "main", "run_conformance"]


def run_conformance(
    url: str,
    *,
    model: str,
    adapter_dir: str,
    bad_rank_dir: str,
    api_key: str | None = None,
    timeout: float = 60.0,
) -> Report:
    """Run every check against ``url``; never raises for a failed check."""
    url = url.rstrip("/")
    report = Report(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    name = f"conf-{os.urandom(4).hex()}"
    with httpx.Client(base_url=url, headers=headers, timeout=timeout) as c:
        run = Runner(c, report)
        probes(run, c, url, model, api_key)
        lora_lifecycle(run, c, model, name, adapter_dir, bad_rank_dir)
        generation(run, c, model, name)
        keysets(run, c, model, name)
        metrics(run, c, model)
        unload(run, c, model, name)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simulator.conformance", description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("--model", required=True, help="served base model name")
    ap.add_argument("--adapter-dir", required=True, help="absolute path of a valid adapter dir")
    ap.add_argument("--bad-rank-dir", required=True, help="adapter dir with a rank over --max-lora-rank")
    ap.add_argument("--api-key")
    ap.add_argument("--json", dest="json_out", help="write the report as JSON here")
    args = ap.parse_args(argv)
    report = run_conformance(
        args.url,
        model=args.model,
        adapter_dir=os.path.abspath(args.adapter_dir),
        bad_rank_dir=os.path.abspath(args.bad_rank_dir),
        api_key=args.api_key,
    )
    for chk in report.checks:
        print(f"{'PASS' if chk.ok else 'FAIL'}  {chk.name}" + ("" if chk.ok else f"\n      {chk.detail}"))
    print(f"{report.passed}/{len(report.checks)} checks passed against {report.url}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report.as_dict(), f, indent=2)
    return 0 if not report.failed else 1


if __name__ == "__main__":
    sys.exit(main())
