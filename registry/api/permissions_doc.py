"""The README's permission table, generated from the routes' declarations (SPEC §14).

``python -m registry.api.permissions_doc`` prints it; ``--write README.md`` replaces the table
between the ``<!-- permissions:begin -->`` / ``<!-- permissions:end -->`` markers. A test checks
that the README matches, so the docs cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from registry.api.app import ADMIN_ROUTERS, PREFIX
from registry.auth import ROLES, is_scoped_for, role_has
from registry.auth.dependencies import Requirement, route_rules

BEGIN = "<!-- permissions:begin -->"
END = "<!-- permissions:end -->"


def _cell(req: Requirement | None, role: str) -> str:
    if req is None:
        return "yes" if role == "admin" else "—"
    if req.permission is None:
        return "yes"
    if not role_has(role, req.permission):
        return "—"
    return "own" if is_scoped_for(role, req.permission) and req.scope is not None else "yes"


def _permission(req: Requirement | None) -> str:
    if req is None:
        return "(undeclared: admin only)"
    if req.permission is None:
        return "any principal"
    text = f"`{req.permission}`"
    for field_name, perm in req.fields:
        text += f" (+ `{perm}` to change `{field_name}`)"
    for flag, perm in req.flags:
        text += f" (+ `{perm}` to set `{flag}: true`)"
    return text


def permission_table() -> str:
    head = "| method | path | permission | " + " | ".join(ROLES) + " |"
    rule = "|---|---|---|" + "---|" * len(ROLES)
    rows = [
        f"| {r.method} | `{r.path[len(PREFIX) :]}` | {_permission(r.requirement)} | "
        + " | ".join(_cell(r.requirement, role) for role in ROLES)
        + " |"
        for r in route_rules(ADMIN_ROUTERS, PREFIX)
    ]
    return "\n".join([head, rule, *rows])


def readme_with_table(readme: str) -> str:
    """``readme`` with the text between the markers replaced by the current table."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + permission_table() + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="update the table in this README instead of printing it")
    args = parser.parse_args(argv)
    if args.write is None:
        print(permission_table())
        return 0
    args.write.write_text(readme_with_table(args.write.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
