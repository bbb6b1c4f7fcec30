"""Where the CLI finds its admin API credentials, like kubectl's contexts.

``loraplane login --url URL --token TOKEN [--context NAME]`` stores them in
``<config dir>/contexts.json`` (``$XDG_CONFIG_HOME/loraplane`` or ``~/.config/loraplane``; the
file is mode 0600, the directory 0700) and makes NAME the current context. ``loraplane up``
saves the context ``local`` (its admin URL and token) the same way and makes it current, as
``kind create cluster`` does for kubectl, so the CLI finds a local platform from any directory.

**A token is bound to its URL.** A context's token is sent only to that context's URL; a data
dir's token only to the URL ``up`` recorded next to it. A command's credentials, first found
wins:

1. an explicit token, ``--token`` or ``LORAPLANE_ADMIN_TOKEN``: sent to ``--url`` /
   ``LORAPLANE_ADMIN_URL``, else to the default ``http://127.0.0.1:8081``;
2. the context named by ``--context`` (or ``LORAPLANE_CONTEXT``): its URL and token; an explicit
   URL other than the context's is refused (:class:`ContextError`), never sent the token;
3. with an explicit URL and no context named: the context saved for that URL (the current one
   first), else a local ``up`` data dir recorded for it, else an error that says how to log in;
4. the current context;
5. a local ``loraplane up``: the admin token and URL it keeps in ``<data dir>/admin_token`` and
   ``<data dir>/admin_url`` (``LORAPLANE_DATA_DIR``, default ``./.loraplane``); a data dir
   without ``admin_url`` (an older ``up``) counts as ``http://127.0.0.1:8081``.

URLs compare by scheme, host and port (default ports filled in, trailing ``/`` ignored); the
loopback names ``localhost``, ``127.0.0.1`` and ``::1`` are one host.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer

from registry.admin_client import DEFAULT_ADMIN_URL

CONFIG_FILE = "contexts.json"
DEFAULT_CONTEXT = "default"
LOCAL_CONTEXT = "local"
DATA_DIR_TOKEN = "admin_token"
DATA_DIR_URL = "admin_url"
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


class ContextError(Exception):
    """A named context that does not exist, a token that may not go to the URL asked for, or an
    unreadable config file."""


@dataclass(frozen=True, slots=True)
class Credentials:
    url: str
    token: str | None
    source: str  # "flags", "context NAME", "local up (PATH)", "none"


def config_path() -> Path:
    return Path(typer.get_app_dir("loraplane")) / CONFIG_FILE


def url_key(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, loopback names folded to one; None if malformed."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname.lower()
    host = "loopback" if host in _LOOPBACK else host
    return scheme, host, port or (443 if scheme == "https" else 80)


def same_url(a: str, b: str) -> bool:
    ka = url_key(a)
    return ka is not None and ka == url_key(b)


def is_loopback(url: str) -> bool:
    key = url_key(url)
    return key is not None and key[1] == "loopback"


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


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, mode 0600."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    os.chmod(path, 0o600)


def save_context(
    name: str, url: str, token: str, *, path: Path | None = None, make_current: bool = True
) -> Path:
    """Add or replace context NAME (and make it current); the file is written 0600 atomically."""
    path = path or config_path()
    data = _load(path)
    data["contexts"][name] = {"url": url.rstrip("/"), "token": token}
    if make_current:
        data["current"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    _write_private(path, json.dumps(data, indent=2) + "\n")
    return path


def use_context(name: str, *, path: Path | None = None) -> Path:
    """Make the saved context NAME current."""
    path = path or config_path()
    data = _load(path)
    if name not in data["contexts"]:
        raise ContextError(f"no context {name!r} (saved: {', '.join(sorted(data['contexts'])) or 'none'})")
    data["current"] = name
    _write_private(path, json.dumps(data, indent=2) + "\n")
    return path


def list_contexts(path: Path | None = None) -> tuple[str | None, dict[str, dict[str, str]]]:
    data = _load(path or config_path())
    return data.get("current"), dict(data["contexts"])


def data_dir() -> Path:
    return Path(os.environ.get("LORAPLANE_DATA_DIR") or ".loraplane")


def record_local_up(directory: Path, url: str) -> None:
    """``up`` writes the admin URL next to the admin token of its data dir (mode 0600)."""
    _write_private(directory / DATA_DIR_URL, url.rstrip("/") + "\n")


def local_up(directory: Path | None = None) -> tuple[str, str, Path] | None:
    """(token, URL, token file) a local ``loraplane up`` keeps in its data dir, if any."""
    d = directory or data_dir()
    path = d / DATA_DIR_TOKEN
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    if not token:
        return None
    try:
        url = (d / DATA_DIR_URL).read_text().strip() or DEFAULT_ADMIN_URL
    except OSError:
        url = DEFAULT_ADMIN_URL
    return token, url, path


def local_up_token(directory: Path | None = None) -> tuple[str, Path] | None:
    """The admin token a local ``loraplane up`` keeps in its data dir, if there is one."""
    found = local_up(directory)
    return (found[0], found[2]) if found else None


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _login_hint(url: str) -> str:
    return f"loraplane login --url {url} --context NAME"


def resolve(url: str | None, token: str | None, context: str | None) -> Credentials:
    """The credentials a command uses (see the module docstring for the order). ``url``, ``token``
    and ``context`` are the flags; their environment variables are read here."""
    url = url or _env("LORAPLANE_ADMIN_URL")
    token = token or _env("LORAPLANE_ADMIN_TOKEN")
    context = context or _env("LORAPLANE_CONTEXT")
    if url is not None and url_key(url) is None:
        raise ContextError(f"--url {url!r} is not an http(s) URL such as {DEFAULT_ADMIN_URL}")
    if token:
        return Credentials(url or DEFAULT_ADMIN_URL, token, "flags")
    current, contexts = list_contexts()
    if context is not None:
        entry = contexts.get(context)
        if entry is None:
            raise ContextError(f"no context {context!r} (run: loraplane login --context {context} …)")
        if url is not None and not same_url(url, entry["url"]):
            raise ContextError(
                f"context {context!r} holds a token for {entry['url']}, not for {url}: a context's "
                f"token is only sent to its own URL. For {url} pass --token (or "
                f"LORAPLANE_ADMIN_TOKEN), or save a context for it: {_login_hint(url)}"
            )
        return Credentials(entry["url"], entry.get("token"), f"context {context}")
    found = local_up()
    if url is not None:
        names = ([current] if current in contexts else []) + sorted(n for n in contexts if n != current)
        for name in names:
            if same_url(url, contexts[name]["url"]):
                return Credentials(url, contexts[name].get("token"), f"context {name}")
        if found is not None and same_url(url, found[1]):
            return Credentials(url, found[0], f"local up ({found[2]})")
        if contexts or found is not None:
            saved = sorted({contexts[n]["url"] for n in contexts} | ({found[1]} if found else set()))
            raise ContextError(
                f"no saved token for {url} (tokens are saved for {', '.join(saved)}, and each is only "
                f"sent to its own URL): pass --token (or LORAPLANE_ADMIN_TOKEN), or log in: "
                f"{_login_hint(url)}"
            )
        return Credentials(url, None, "none")
    if current is not None and current in contexts:
        entry = contexts[current]
        return Credentials(entry["url"], entry.get("token"), f"context {current}")
    if found is not None:
        return Credentials(found[1], found[0], f"local up ({found[2]})")
    return Credentials(DEFAULT_ADMIN_URL, None, "none")
