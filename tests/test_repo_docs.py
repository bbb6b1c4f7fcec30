"""The repository is self-contained: no tracked file points outside it, every relative link in
the docs resolves, and docs/settings.md matches the settings classes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# spelled in pieces so this file does not match itself
OUTSIDE = ("../" + "shared", "/" + "work" + "/")
DOCS = ("admin-api.md", "gateway-api.md", "settings.md", "deployment.md", "operations.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _tracked() -> list[str]:
    res = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip("not a git checkout")
    return [f for f in res.stdout.splitlines() if f]


def test_no_tracked_file_points_outside_the_repository() -> None:
    offenders = []
    for name in _tracked():
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 5_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for needle in OUTSIDE:
            for lineno, line in enumerate(text.splitlines(), 1):
                if needle in line:
                    offenders.append(f"{name}:{lineno}: {line.strip()[:100]}")
    assert offenders == []


def test_readme_links_the_docs_and_every_relative_link_resolves() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in DOCS:
        assert f"](docs/{doc})" in readme, f"README's documentation map lacks docs/{doc}"
    pages = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "deploy").rglob("*.md")),
    ]
    checked = 0
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            file_part = target.split("#", 1)[0]
            resolved = (page.parent / file_part).resolve()
            assert resolved.is_relative_to(ROOT), f"{page.name} links outside the repository: {target}"
            assert resolved.exists(), f"{page.relative_to(ROOT)}: broken link {target}"
            checked += 1
    assert checked >= 10


def test_settings_reference_matches_the_settings_classes() -> None:
    res = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate_settings.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    text = (ROOT / "docs" / "settings.md").read_text()
    from gateway.settings import GatewaySettings
    from registry.settings import RegistrySettings
    from router.settings import RouterSettings

    for cls in (RegistrySettings, RouterSettings, GatewaySettings):
        for name in cls.model_fields:
            assert f"`LORAPLANE_{name.upper()}`" in text


def test_the_architecture_picture_is_what_its_script_draws() -> None:
    """docs/architecture.svg is drawn by docs/architecture.py (standard library only): the
    committed picture must be exactly what the script makes, and the README shows it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("architecture", ROOT / "docs" / "architecture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    svg = module.render()
    assert (ROOT / "docs" / "architecture.svg").read_text() == svg, "run: python docs/architecture.py"
    assert svg.startswith("<svg ") and "Registry (admin API, :8081)" in svg and "Replica" in svg
    assert "](docs/architecture.svg)" in (ROOT / "README.md").read_text()
