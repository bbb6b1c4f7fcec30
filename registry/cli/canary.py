"""``loraplane adapters canary ID [--clear]`` (SPEC §19): show the adapter's canary, or end it
(``DELETE /adapters/{id}/canary``; start one with ``adapters promote ID vN --canary W``).

``loraplane adapters canary-policy ID [options] | --clear`` (SPEC §16): set, show or remove the
adapter's canary policy through ``PATCH /adapters/{id}``. Options left out take the defaults;
with no option at all the current policy is shown."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from registry.cli._common import CliOptions, admin_command, client, fmt, out_console, print_json
from registry.cli.adapters import AdapterArg, adapters_app


def _canary_line(a: dict[str, Any]) -> str:
    active = a.get("active_version") or "none"
    if a.get("canary_version"):
        return f"canary {a['canary_version']} at {a.get('canary_weight')}% (active {active})"
    return f"no canary (active {active})"


@admin_command(adapters_app, "canary")
def canary(
    opts: CliOptions,
    adapter: AdapterArg,
    clear: Annotated[
        bool, typer.Option("--clear", help="End the canary: all traffic to the active version, kept.")
    ] = False,
) -> None:
    """Show the adapter's canary, or end it with --clear (start one with: adapters promote ID vN
    --canary WEIGHT)."""
    with client(opts) as admin:
        before = admin.get_adapter(adapter)
        got = admin.end_canary(adapter) if clear else before
    if opts.as_json:
        print_json(got)
        return
    if clear and before.get("canary_version"):
        out_console().print(f"{adapter}: canary {before['canary_version']} ended; {_canary_line(got)}")
    else:
        out_console().print(f"{adapter}: {_canary_line(got)}")


@admin_command(adapters_app, "canary-policy")
def canary_policy(
    opts: CliOptions,
    adapter: AdapterArg,
    min_requests: Annotated[
        int | None, typer.Option("--min-requests", help="Answers each arm needs before the first test.")
    ] = None,
    max_error_rate_delta: Annotated[
        float | None,
        typer.Option("--max-error-rate-delta", help="Allowed error-rate increase (0.02 = 2 points)."),
    ] = None,
    max_ttft_p99_ratio: Annotated[
        float | None, typer.Option("--max-ttft-p99-ratio", help="Allowed canary/active TTFT p99 ratio.")
    ] = None,
    max_check_failure_rate_delta: Annotated[
        float | None,
        typer.Option("--max-check-failure-rate-delta", help="Allowed increase of format-check failures."),
    ] = None,
    window_s: Annotated[
        float | None, typer.Option("--window-s", help="Evidence window in seconds (its looks share α).")
    ] = None,
    auto_promote_after_s: Annotated[
        float | None,
        typer.Option(
            "--auto-promote-after-s", help="Promote (or request it) after this long without breach."
        ),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Remove the policy: canaries run unwatched.")
    ] = False,
) -> None:
    """Set the adapter's canary policy (the options given; the rest take their defaults), show it,
    or remove it with --clear."""
    values = {
        "min_requests": min_requests,
        "max_error_rate_delta": max_error_rate_delta,
        "max_ttft_p99_ratio": max_ttft_p99_ratio,
        "max_check_failure_rate_delta": max_check_failure_rate_delta,
        "window_s": window_s,
        "auto_promote_after_s": auto_promote_after_s,
    }
    given = {k: v for k, v in values.items() if v is not None}
    if clear and given:
        raise typer.BadParameter("--clear takes no other option")
    path = f"/adapters/{quote(adapter, safe='')}"
    with client(opts) as admin:
        if clear:
            got: Any = admin.request("PATCH", path, json_body={"canary_policy": None})
        elif given:
            got = admin.request("PATCH", path, json_body={"canary_policy": given})
        else:
            got = admin.get_adapter(adapter)
    policy = got.get("canary_policy")
    if opts.as_json:
        print_json({"adapter": adapter, "canary_policy": policy})
        return
    out_console().print(
        f"{adapter} canary policy: {fmt(policy) if policy else 'none (canaries run unwatched)'}"
    )
