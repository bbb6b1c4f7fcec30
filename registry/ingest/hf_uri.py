"""``hf://ORG/REPO[@REVISION][/SUBDIR]``: parsing and the allow-list, before anything is fetched.

The grammar is huggingface_hub's own (``parse_hf_uri``: ``hf://[TYPE/]ID[@REVISION][/PATH]``),
limited to model repositories. A missing revision means ``main``; a branch or tag is resolved to
its commit once, at import. Special refs (``refs/pr/3``) work as the library parses them; another
revision with a ``/`` is written with ``%2F``.

``LORAPLANE_ALLOWED_SOURCES`` entries that start with ``hf://`` are glob patterns over the
repository (``hf://my-org/*``, ``hf://my-org/lora-*``, ``hf://my-org/one-repo``), matched case-
sensitively against ``hf://ORG/REPO``; a URI no pattern matches is 422 ``source_not_allowed``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from kit.errors import InvalidRequest

HF_SCHEME = "hf://"
DEFAULT_REVISION = "main"
MAX_URI_CHARS = 1024


class SourceNotAllowed(InvalidRequest):
    """422 ``source_not_allowed``: the source is outside ``LORAPLANE_ALLOWED_SOURCES``."""

    code = "source_not_allowed"


@dataclass(frozen=True, slots=True)
class HfRef:
    """A parsed ``hf://`` source: repository, revision as asked, directory inside the repo."""

    repo_id: str
    revision: str
    subdir: str  # "" for the repository root, else without leading/trailing "/"

    @property
    def uri(self) -> str:
        """The canonical form recorded as the version's ``source_uri``."""
        from huggingface_hub import HfUri

        rendered = HfUri(type="model", id=self.repo_id, revision=self.revision, path_in_repo=self.subdir)
        return rendered.to_uri().replace(f"{HF_SCHEME}models/", HF_SCHEME, 1)

    @property
    def repo_uri(self) -> str:
        return f"{HF_SCHEME}{self.repo_id}"


def is_hf_uri(uri: object) -> bool:
    return isinstance(uri, str) and uri.startswith(HF_SCHEME)


def parse_hf_uri(uri: str) -> HfRef:
    """The parsed reference, or 422 ``invalid_request`` saying what is wrong with ``uri``."""
    from huggingface_hub.errors import HfUriError
    from huggingface_hub.utils import parse_hf_uri as library_parse

    if len(uri) > MAX_URI_CHARS:
        raise InvalidRequest(f"source_uri is longer than {MAX_URI_CHARS} characters")
    if any(c in uri for c in "\\?#") or any(ord(c) < 0x21 or ord(c) == 0x7F for c in uri):
        raise InvalidRequest(f"source_uri {uri!r} holds characters that are not allowed (\\ ? # or spaces)")
    try:
        parsed = library_parse(uri)
    except HfUriError as e:
        raise InvalidRequest(
            f"source_uri {uri!r} is not a Hugging Face URI: expected hf://ORG/REPO@REVISION[/SUBDIR]",
            details={"reason": str(e)},
        ) from None
    if parsed.type != "model":
        raise InvalidRequest(f"source_uri {uri!r}: only model repositories can be imported ({parsed.type})")
    revision = parsed.revision if parsed.revision is not None else DEFAULT_REVISION
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in revision):
        raise InvalidRequest(f"source_uri {uri!r}: the revision holds spaces or control characters")
    subdir = parsed.path_in_repo.strip("/")
    segments = subdir.split("/") if subdir else []
    if any(s in ("", ".", "..") for s in segments):
        raise InvalidRequest(f"source_uri {uri!r} must not contain '.', '..' or empty path segments")
    return HfRef(repo_id=parsed.id, revision=revision, subdir=subdir)


def _pattern(entry: str) -> str | None:
    if not entry.startswith(HF_SCHEME):
        return None
    body = entry[len(HF_SCHEME) :]
    if body.startswith("models/"):
        body = body[len("models/") :]
    return HF_SCHEME + body.rstrip("/") if body.strip("/") else None


def check_hf_uri(uri: str, allowed_sources: list[str]) -> HfRef:
    """The parsed reference when an ``hf://`` pattern of ``allowed_sources`` matches its
    repository; else 422 (``invalid_request`` for a malformed URI, ``source_not_allowed``)."""
    ref = parse_hf_uri(uri)
    patterns = [p for p in (_pattern(e) for e in allowed_sources) if p is not None]
    if not patterns:
        raise SourceNotAllowed(
            f"source_uri {uri!r}: imports from the Hugging Face Hub are disabled "
            "(no hf:// pattern in LORAPLANE_ALLOWED_SOURCES)",
            details={"source_uri": uri, "allowed_sources": []},
        )
    if any(fnmatch.fnmatchcase(ref.repo_uri, p) for p in patterns):
        return ref
    raise SourceNotAllowed(
        f"source_uri {uri!r}: repository {ref.repo_id!r} is not allowed by LORAPLANE_ALLOWED_SOURCES",
        details={"source_uri": uri, "allowed_sources": patterns},
    )
