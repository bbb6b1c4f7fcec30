"""Where the CLI finds its admin API credentials, like kubectl's contexts.

``loraplane login --url URL --token TOKEN [--context NAME]`` stores them in
``<config dir>/contexts.json`` (``$XDG_CONFIG_HOME/loraplane`` or ``~/.config/loraplane``; the
file is mode 0600, the directory 0700) and makes NAME the current context.

A command's credentials, first found wins:

1. ``--url`` / ``--token`` (or ``LORAPLANE_ADMIN_URL`` / ``LORAPLANE_ADMIN_TOKEN``);
2. the context named by ``--context`` (or ``LORAPLANE_CONTEXT``), else the current one;
3. a local ``loraplane up``: the admin token it keeps in ``<data dir>/admin_token``
   (``LORAPLANE_DATA_DIR``, default ``./.loraplane``) at ``http://127.0.0.1:8081``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from registry.admin_client import DEFAULT_ADMIN_URL

CONFIG_FILE = "contexts.json"
DEFAULT_CONTEXT = "default"


class ContextError(Exception):
    """A named context that does not exist, or an unreadable config file."""


@dataclass(frozen=True, slots=True)
class Credentials:
    url: str
    token: str | None
    source: str  # "flags", "context NAME", "local up (PATH)", "none"


def config_path() -> Path:
    return Path(typer.get_app_dir("loraplane")) / CONFIG_FILE


def _load(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"current": None, "contexts": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ContextError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("contexts"), dict):
        raise ContextError(f"{path} is not a loraplane contexts file")
    return data


def save_context(name: str, url: str, token: str, *, path: Path | None = None) -> Path:
    """Add or replace context NAME and make it current; the file is written 0600 atomically."""
    path = path or config_path()
    data = _load(path)
    data["contexts"][name] = {"url": url.rstrip("/"), "token": token}
    data["current"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    os.chmod(path, 0o600)
    return path


def list_contexts(path: Path | None = None) -> tuple[str | None, dict[str, dict[str, str]]]:
    data = _load(path or config_path())
    return data.get("current"), dict(data["contexts"])


def local_up_token(data_dir: Path | None = None) -> tuple[str, Path] | None:
    """The admin token a local ``loraplane up`` keeps in its data dir, if there is one."""
    d = data_dir or Path(os.environ.get("LORAPLANE_DATA_DIR") or ".loraplane")
    path = d / "admin_token"
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return (token, path) if token else None


def resolve(url: str | None, token: str | None, context: str | None) -> Credentials:
    """The credentials a command uses (see the module docstring for the order)."""
    if token:
        return Credentials(url or DEFAULT_ADMIN_URL, token, "flags")
    current, contexts = list_contexts()
    name = context or current
    if context is not None and context not in contexts:
        raise ContextError(f"no context {context!r} (run: loraplane login --context {context} …)")
    if name is not None and name in contexts:
        entry = contexts[name]
        return Credentials(url or entry["url"], entry.get("token"), f"context {name}")
    found = local_up_token()
    if found is not None:
        return Credentials(url or DEFAULT_ADMIN_URL, found[0], f"local up ({found[1]})")
    return Credentials(url or DEFAULT_ADMIN_URL, None, "none")
