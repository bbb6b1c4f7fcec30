"""``loraplane adapters regression-set | quality-policy | eval | evals | eval-show`` (SPEC §16):
upload a regression set, set the quality policy, run an evaluation (``--wait``: a progress bar,
then a table per arm, the verdict, and the cases whose output changed between the current
version and the candidate, side by side).

Exit status of ``eval --wait`` / ``eval-show``: 0 when the verdict passed, 3 when it failed, 1
when the evaluation itself failed (its error is printed)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from registry.admin_client import AdminClient
from registry.cli._common import (
    CliOptions,
    admin_command,
    client,
    emit,
    err_console,
    fail,
    field,
    fmt,
    normalise_version,
    out_console,
    print_json,
)
from registry.cli.adapters import AdapterArg, VersionArg, adapters_app

EXIT_VERDICT_FAILED = 3
ARMS = ("base", "current", "candidate")
_OUTPUT_CHARS = 600  # of each side in the diff table


@admin_command(adapters_app, "regression-set")
def regression_set(
    opts: CliOptions,
    adapter: AdapterArg,
    file: Annotated[
        Path | None,
        typer.Argument(help="JSON Lines (one case per line) or a JSON array; omit to show the stored set."),
    ] = None,
    version: Annotated[
        int | None, typer.Option("--version", help="Show this older version of the set.")
    ] = None,
) -> None:
    """Upload a new version of the adapter's regression set (every problem is listed when it is
    refused), or show the stored one."""
    with client(opts) as admin:
        if file is None:
            got = admin.get_regression_set(adapter, version)
            emit(opts, got, summary=f"{adapter} regression set v{got['version']}", skip=("cases",))
            return
        try:
            body = file.read_bytes()
        except OSError as e:
            raise fail(f"cannot read {file}: {e.strerror or e}") from None
        stored = admin.put_regression_set(adapter, body)
    emit(
        opts,
        stored,
        summary=f"{adapter} regression set v{stored['version']}: {stored['case_count']} cases, "
        f"sha256 {stored['sha256'][:16]}…",
        skip=("cases",),
    )


@admin_command(adapters_app, "quality-policy")
def quality_policy(
    opts: CliOptions,
    adapter: AdapterArg,
    min_pass_rate: Annotated[
        float | None, typer.Option("--min-pass-rate", help="Candidate pass rate at least this (0–1).")
    ] = None,
    max_regression_pp: Annotated[
        float | None,
        typer.Option("--max-regression-pp", help="At most this many points below the current version."),
    ] = None,
    max_format_error_rate: Annotated[
        float | None,
        typer.Option("--max-format-error-rate", help="json_schema/regex failures at most (0–1)."),
    ] = None,
) -> None:
    """Set the adapter's quality policy (the options given; the rest take their defaults), or show it."""
    with client(opts) as admin:
        values = {
            "min_pass_rate": min_pass_rate,
            "max_regression_pp": max_regression_pp,
            "max_format_error_rate": max_format_error_rate,
        }
        if all(v is None for v in values.values()):
            got = admin.get_quality_policy(adapter)
        else:
            got = admin.put_quality_policy(adapter, values)
    if opts.as_json:
        print_json(got)
        return
    out_console().print(f"{adapter} quality policy (effective): {fmt(got['effective'])}")


def _pct(v: Any) -> str:
    return "-" if v is None else f"{float(v) * 100:.1f}%"


def _arm_table(result: dict[str, Any]) -> Table:
    arms = [a for a in ARMS if result["arms"].get(a)]
    table = Table(title="Arms")
    table.add_column("")
    for a in arms:
        table.add_column(f"{a}\n{result['models'][a]}", overflow="fold")
    stats = {a: result["arms"][a] for a in arms}
    checks = sorted({k for s in stats.values() for k in s["pass_rate_by_check"]})
    rows: list[tuple[str, Any]] = [
        ("pass rate", lambda s: _pct(s["pass_rate"])),
        *((f"  {c}", lambda s, c=c: _pct(s["pass_rate_by_check"].get(c))) for c in checks),
        ("format errors", lambda s: _pct(s["format_error_rate"])),
        ("refusals", lambda s: _pct(s["refusal_rate"])),
        ("failed requests", lambda s: str(s["errors"])),
        ("mean output chars", lambda s: fmt(s["mean_output_chars"])),
        ("latency p50 / p99 ms", lambda s: f"{fmt(s['latency_ms']['p50'])} / {fmt(s['latency_ms']['p99'])}"),
    ]
    for label, get in rows:
        table.add_row(label, *(get(stats[a]) for a in arms))
    return table


def _clip(text: str | None, error: str | None) -> Text:
    if text is None:
        return Text(f"(no answer: {error})", style="red")
    return Text(text if len(text) <= _OUTPUT_CHARS else text[:_OUTPUT_CHARS] + " …")


def _checks_line(arm: dict[str, Any]) -> str:
    bad = [f"{c['type']}: {c['reason']}" for c in arm["checks"] if not c["passed"]]
    return "passed" if not bad else "failed — " + "; ".join(bad)


def _diff_table(result: dict[str, Any], limit: int) -> tuple[Table | None, str, int]:
    other = "current" if result["arms"].get("current") else "base"
    key = f"changed_vs_{other}"
    changed = [c for c in result["cases"] if c.get(key)]
    if not changed:
        return None, other, 0
    table = Table(title=f"Cases whose output changed: {other} → candidate", show_lines=True, expand=True)
    table.add_column("case", overflow="fold")
    table.add_column(other, overflow="fold", ratio=1)
    table.add_column("candidate", overflow="fold", ratio=1)
    for case in changed[:limit]:
        old, new = case["arms"][other], case["arms"]["candidate"]
        left = Text.assemble(_clip(old["output"], old["error"]), "\n", (_checks_line(old), "dim"))
        right = Text.assemble(_clip(new["output"], new["error"]), "\n", (_checks_line(new), "dim"))
        table.add_row(case["id"], left, right)
    return table, other, len(changed)


def print_evaluation(ev: dict[str, Any], opts: CliOptions, *, show: int) -> None:
    """The evaluation record, then (finished) the arms, the pairwise figures, the verdict and the
    changed cases; exits with the verdict's status."""
    if opts.as_json:
        print_json(ev)
    else:
        _print_human(ev, show)
    if ev["status"] == "failed":
        raise typer.Exit(1)
    if ev["status"] == "succeeded" and ev["verdict"] != "passed":
        raise typer.Exit(EXIT_VERDICT_FAILED)


def _print_human(ev: dict[str, Any], show: int) -> None:
    console = out_console()
    head = f"evaluation {ev['id']} of {ev['adapter_id']} {ev['version']}: {ev['status']}"
    if ev["status"] == "running":
        p = ev["progress"]
        console.print(f"{head} ({p['done']}/{p['total']} requests)")
        return
    if ev["status"] == "failed":
        console.print(f"{head}\nerror: {ev['error']}")
        return
    result = ev["result"]
    rs = result["regression_set"]
    console.print(
        f"{head} — regression set v{rs['version']} ({len(result['cases'])} cases), "
        f"seed {result['request']['seed']}"
    )
    console.print(_arm_table(result))
    for name, pw in result["pairwise"].items():
        if pw is not None:
            console.print(
                f"{name.replace('_', ' ')}: exact match {_pct(pw['exact_match_rate'])}, "
                f"similarity {fmt(pw['similarity'])} over {pw['cases']} cases"
            )
    table, other, n = _diff_table(result, show)
    if table is None:
        console.print(f"no case changed its output between {other} and candidate")
    else:
        console.print(table)
        if n > show:
            console.print(f"… {n - show} more changed cases (--show N, or --json for all)")
    v = result["verdict"]
    style = "green" if v["passed"] else "red"
    console.print(
        Text(f"verdict: {v['gate']} — quality gate of {ev['version']} set to {v['gate']}", style=style)
    )
    for reason in v["reasons"]:
        console.print(f"  - {reason}")


def _wait(admin: AdminClient, ev: dict[str, Any], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    columns = (
        TextColumn("evaluating {task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.completed}/{task.total} requests"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console(), transient=True) as bar:
        task = bar.add_task(f"{ev['adapter_id']} {ev['version']}", total=ev["progress"]["total"] or None)
        while ev["status"] == "running":
            if time.monotonic() > deadline:
                raise fail(
                    f"evaluation {ev['id']} still running after {timeout:g} s (see `adapters eval-show`)"
                )
            time.sleep(0.5)
            ev = admin.get_evaluation(ev["adapter_id"], ev["version"], ev["id"])
            bar.update(task, completed=ev["progress"]["done"])
    return ev


ShowOpt = Annotated[int, typer.Option("--show", min=0, help="Changed cases to show side by side.")]


@admin_command(adapters_app, "eval")
def evaluate(
    opts: CliOptions,
    adapter: AdapterArg,
    version: VersionArg,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the result (progress bar), then print it.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds --wait waits at most.")] = 3600,
    show: ShowOpt = 10,
) -> None:
    """Evaluate a version: every case of the regression set through the gateway for the base model,
    the active version and this one. The verdict sets the version's quality gate."""
    v = normalise_version(version)
    with client(opts) as admin:
        ev = admin.start_evaluation(adapter, v)
        if not wait:
            emit(
                opts,
                ev,
                summary=f"evaluation {ev['id']} started "
                f"(`loraplane adapters eval-show {adapter} {v} {ev['id']}`)",
            )
            return
        ev = _wait(admin, ev, timeout)
    print_evaluation(ev, opts, show=show)


@admin_command(adapters_app, "eval-show")
def eval_show(
    opts: CliOptions,
    adapter: AdapterArg,
    version: VersionArg,
    evaluation: Annotated[str, typer.Argument(help="Evaluation id (ev_…).")],
    show: ShowOpt = 10,
) -> None:
    """Show one evaluation: progress, or the arms, the verdict and the changed cases."""
    with client(opts) as admin:
        ev = admin.get_evaluation(adapter, normalise_version(version), evaluation)
    print_evaluation(ev, opts, show=show)


@admin_command(adapters_app, "evals")
def evals(
    opts: CliOptions,
    adapter: AdapterArg,
    version: Annotated[str | None, typer.Argument(help="Only this version's evaluations.")] = None,
) -> None:
    """The adapter's evaluations, newest first."""
    with client(opts) as admin:
        rows = admin.list_evaluations(adapter, normalise_version(version) if version else None)
    columns = [
        ("id", field("id")),
        ("version", field("version")),
        ("status", field("status")),
        ("verdict", field("verdict")),
        ("progress", lambda e: f"{e['progress']['done']}/{e['progress']['total']}"),
        ("by", field("created_by")),
        ("started", field("created_at")),
        ("error", field("error")),
    ]
    emit(opts, rows, columns=columns, title="Evaluations")
