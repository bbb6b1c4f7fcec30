"""``loraplane replicas list|plan``: the replicas and the placement plan (issue 28).

``list`` is ``adapters replicas`` under the name operators look for; ``plan`` shows what the
cluster's placement controller last published: the desired replicas per pool (the autoscaling
signal) and, per planned adapter version, busiest first, its forecast demand, how many replicas
the plan gives it, which, and where it is now (``GET /admin/v1/replicas/plan``; ``--json``
prints that answer as it came).
"""

from __future__ import annotations

from typing import Any

import typer

from registry.cli._common import CliOptions, admin_command, client, emit, field, fmt, new_group
from registry.cli.ops import REPLICA_COLUMNS
from registry.cli.tables import extra, text

replicas_app = new_group("Replicas and the placement plan: what runs where, and where it should.")


@admin_command(replicas_app, "list")
def list_replicas(opts: CliOptions) -> None:
    """Every replica: health, adapters loaded, requests running/waiting."""
    with client(opts) as admin:
        rows = admin.list_replicas()
    emit(opts, rows, columns=REPLICA_COLUMNS, title="Replicas")


def _rps(row: dict[str, Any]) -> str:
    v = row.get("demand_rps")
    return "-" if v is None else f"{float(v):.3f}"


def _now(row: dict[str, Any]) -> str:
    items = [f"{c.get('url')} ({c.get('state')})" for c in row.get("current") or []]
    return "\n".join(items) or "-"


def _lines(name: str) -> Any:
    return lambda row: "\n".join(str(u) for u in row.get(name) or []) or "-"


def plan_summary(plan: dict[str, Any]) -> str:
    """One line: when the plan was made, the desired replicas per pool, the copies that found no slot."""
    if not plan.get("published"):
        return (
            "No placement plan is published: the controller is off (LORAPLANE_PLAN_INTERVAL_S=0) "
            "or has not planned yet."
        )
    desired = ", ".join(f"{pool}={n}" for pool, n in (plan.get("desired_replicas") or {}).items()) or "-"
    age = plan.get("age_s")
    at = fmt(plan.get("at"))
    when = f"{at} ({age:.1f} s ago)" if isinstance(age, int | float) else at
    return f"Plan of {when}; desired replicas: {desired}; copies without a slot: {plan.get('overflow', 0)}"


@admin_command(replicas_app, "plan")
def plan(opts: CliOptions) -> None:
    """The placement plan: per adapter version its demand, planned replicas and where it is now."""
    with client(opts) as admin:
        answer = admin.replica_plan()
    if opts.as_json:
        emit(opts, answer)
        return
    typer.echo(plan_summary(answer))
    if not answer.get("published"):
        return
    emit(
        opts,
        answer.get("adapters") or [],
        columns=[
            ("adapter", field("adapter")),
            ("version", field("version")),
            ("demand rps", _rps),
            ("planned", field("planned_replicas")),
            text("targets", _lines("targets")),
            text("now", _now),
            extra("missing", _lines("missing")),
        ],
        title="Planned adapters",
    )
