"""Draw docs/architecture.svg, the README's picture of loraplane's parts (standard library only).

    python docs/architecture.py          # rewrite docs/architecture.svg
    python docs/architecture.py --check  # exit 1 if the committed SVG is not what this draws

The picture is data (``BOXES``, ``ARROWS``) rendered to plain SVG: boxes with a title and a few
lines, arrows with a label. ``tests/test_repo_docs.py`` checks that the committed file is exactly
what this script makes, so change the data here and rerun it, never the SVG by hand.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).with_name("architecture.svg")
WIDTH, HEIGHT = 980, 560
FONT = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"


@dataclass(frozen=True)
class Box:
    key: str
    x: int
    y: int
    w: int
    h: int
    title: str
    lines: tuple[str, ...] = ()
    kind: str = "part"  # part | store | outside | replica


@dataclass(frozen=True)
class Arrow:
    src: str
    dst: str
    label: str
    src_side: str  # "top" | "bottom" | "left" | "right"
    dst_side: str
    dashed: bool = False
    label_dx: int = 0
    label_dy: int = 0
    src_dx: int = 0  # move the start along the box's side
    via: tuple[tuple[int, int], ...] = ()  # corners of a routed line; the label sits on its middle leg


BOXES = (
    Box("ops", 40, 24, 320, 64, "Operators", ("loraplane CLI · admin console · CI jobs",), "outside"),
    Box("clients", 600, 24, 340, 64, "Applications", ("any OpenAI client: model = BASE:ADAPTER",), "outside"),
    Box(
        "registry",
        40,
        150,
        320,
        150,
        "Registry (admin API, :8081)",
        (
            "adapters, versions, sha256 of every file",
            "promote · canary · rollback · kill switch",
            "approvals, quality gates, canary analysis",
            "tenants, keys, grants, limits · audit log",
            "console at /admin/ui",
        ),
    ),
    Box(
        "gateway",
        600,
        150,
        340,
        150,
        "Gateway (OpenAI API, :8080)",
        (
            "API key → tenant, grant, rate limits",
            "model → version (active, canary, @vN)",
            "router: picks the replica, loads the adapter",
            "there first if needed, streams the answer",
            "back; metrics per tenant, adapter, version",
        ),
    ),
    Box("db", 40, 380, 150, 70, "Database", ("PostgreSQL or SQLite",), "store"),
    Box("s3", 205, 380, 175, 70, "Adapter files", ("S3 or a local directory",), "store"),
    Box(
        "redis",
        398,
        380,
        188,
        70,
        "Redis",
        ("limits, leases, loads in flight", "(shared by gateways)"),
        "store",
    ),
    Box("r1", 600, 380, 165, 70, "Replica", ("vLLM · SGLang · …", "base model + LoRA slots"), "replica"),
    Box("r2", 775, 380, 165, 70, "Replica", ("vLLM · SGLang · …", "base model + LoRA slots"), "replica"),
)

ARROWS = (
    Arrow("ops", "registry", "admin API (token)", "bottom", "top", label_dx=58),
    Arrow("clients", "gateway", "/v1/chat/completions (tenant key)", "bottom", "top", label_dx=-100),
    Arrow("registry", "db", "state, audit", "bottom", "top", label_dx=-50),
    Arrow("registry", "s3", "verified uploads", "bottom", "top", label_dx=62),
    Arrow("registry", "gateway", "change feed:", "right", "left", label_dy=-26),
    Arrow("registry", "gateway", "every gateway within 1 s", "right", "left", label_dy=-10),
    Arrow("gateway", "redis", "", "bottom", "top", dashed=True, src_dx=-130),
    Arrow("gateway", "r1", "load / unload", "bottom", "top", label_dx=-52),
    Arrow("gateway", "r2", "forward, stream", "bottom", "top", label_dx=56),
    Arrow(
        "s3",
        "r1",
        "files staged, sha256 checked before every load",
        "bottom",
        "bottom",
        dashed=True,
        via=((292, 490), (682, 490)),
        label_dy=-6,
    ),
)

STYLE = {
    "part": ("#eef3fc", "#2456c7"),
    "store": ("#f4f5f7", "#6b7486"),
    "outside": ("#ffffff", "#9aa6b8"),
    "replica": ("#eaf6ef", "#17794a"),
}


def _anchor(b: Box, side: str) -> tuple[int, int]:
    return {
        "top": (b.x + b.w // 2, b.y),
        "bottom": (b.x + b.w // 2, b.y + b.h),
        "left": (b.x, b.y + b.h // 2),
        "right": (b.x + b.w, b.y + b.h // 2),
    }[side]


def _box(b: Box) -> list[str]:
    fill, stroke = STYLE[b.kind]
    out = [
        f'<rect x="{b.x}" y="{b.y}" width="{b.w}" height="{b.h}" rx="8" fill="{fill}" stroke="{stroke}" '
        f'stroke-width="1.5"/>',
        f'<text x="{b.x + 12}" y="{b.y + 22}" class="title">{escape(b.title)}</text>',
    ]
    for i, line in enumerate(b.lines):
        out.append(f'<text x="{b.x + 12}" y="{b.y + 42 + 18 * i}" class="line">{escape(line)}</text>')
    return out


def _arrow(a: Arrow, boxes: dict[str, Box]) -> list[str]:
    x1, y1 = _anchor(boxes[a.src], a.src_side)
    x2, y2 = _anchor(boxes[a.dst], a.dst_side)
    points = [(x1 + a.src_dx, y1), *a.via, (x2, y2)]
    dash = ' stroke-dasharray="5 4"' if a.dashed else ""
    path = " ".join(f"{x},{y}" for x, y in points)
    out = [f'<polyline points="{path}" fill="none" class="arrow"{dash} marker-end="url(#head)"/>']
    if a.label:
        mid = len(points) // 2
        (ax, ay), (bx, by) = points[mid - 1], points[mid]
        lx, ly = (ax + bx) // 2 + a.label_dx, (ay + by) // 2 + a.label_dy
        out.append(f'<text x="{lx}" y="{ly}" class="label" text-anchor="middle">{escape(a.label)}</text>')
    return out


def render() -> str:
    boxes = {b.key: b for b in BOXES}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-labelledby="t d">',
        '<title id="t">loraplane: registry, gateway with its router, replicas</title>',
        '<desc id="d">Operators use the registry\'s admin API; applications call the gateway, whose '
        "router loads verified adapter versions onto the replicas and forwards each request.</desc>",
        "<defs>",
        '<marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#4a5568"/></marker>',
        "<style>",
        f".title {{ font: 600 14px {FONT}; fill: #1d2430; }}",
        f".line {{ font: 12px {FONT}; fill: #3b4453; }}",
        f".label {{ font: italic 11.5px {FONT}; fill: #4a5568; }}",
        ".arrow { stroke: #4a5568; stroke-width: 1.5; }",
        "</style>",
        "</defs>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
    ]
    for b in BOXES:
        parts += _box(b)
    for a in ARROWS:
        parts += _arrow(a, boxes)
    parts.append(
        f'<text x="{WIDTH // 2}" y="{HEIGHT - 24}" class="line" text-anchor="middle">'
        "`loraplane up` runs the registry, the gateway and simulated replicas in one process group; "
        "in production each part scales on its own.</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    svg = render()
    if "--check" in argv:
        same = OUT.exists() and OUT.read_text() == svg
        if not same:
            print(f"{OUT} is not what {Path(__file__).name} draws: run python {__file__}", file=sys.stderr)
        return 0 if same else 1
    OUT.write_text(svg)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
