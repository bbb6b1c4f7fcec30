"""Simulated behaviours per adapter (SPEC §16): error rate, latency factor, refusals, output format.

A behaviour set is a JSON object whose keys are globs over the ``lora_name`` a request is served
by (the base name for base-model requests) and whose values say how those answers misbehave::

    {"support@v2-*": {"error_rate": 0.05, "latency_factor": 2, "refusal_rate": 0.1,
                      "output": "json", "stream_error_rate": 0.2}}

Every field is optional (defaults: healthy). ``parse_behaviours`` validates strictly and lists
every problem; ``load_behaviours`` reads an inline object (text starting with ``{``) or a file
path. ``BehaviourSet.lookup(name)`` picks an exact key first, else the first matching glob in
the object's order. ``Draws`` turns a request into deterministic numbers in ``[0, 1)``: from the
request's ``seed`` when it has one (same request + seed → same behaviour), else fresh randomness
(like vLLM's unseeded sampling).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ENV_VAR",
    "OUTPUTS",
    "Behaviour",
    "BehaviourError",
    "BehaviourSet",
    "Draws",
    "load_behaviours",
    "parse_behaviours",
]

ENV_VAR = "LORAPLANE_SIM_BEHAVIOURS"
OutputKind = Literal["text", "json", "broken_json"]
OUTPUTS: tuple[OutputKind, ...] = ("text", "json", "broken_json")
_FIELDS = ("error_rate", "latency_factor", "refusal_rate", "output", "stream_error_rate")
_MAX_LATENCY_FACTOR = 1000.0
_MAX_KEY_LEN = 512
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class BehaviourError(ValueError):
    """A behaviour set that does not validate; ``problems`` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid simulated behaviours: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class Behaviour:
    error_rate: float = 0.0  # share of requests that answer vLLM's 500 (in-band error when streaming)
    latency_factor: float = 1.0  # multiplies the timing model's durations for these answers (>= 1)
    refusal_rate: float = 0.0  # share of choices whose text is a refusal
    output: OutputKind = "text"  # text, a valid JSON object, or a truncated (invalid) one
    # share of *streamed* requests whose stream fails after some tokens with the in-band error
    # vLLM's stream generator sends for an exception (``data: {"error": …}`` then ``[DONE]``)
    stream_error_rate: float = 0.0

    @property
    def healthy(self) -> bool:
        return self == Behaviour()


@dataclass(frozen=True)
class BehaviourSet:
    """Validated behaviours, keyed by glob, in the order given."""

    rules: tuple[tuple[str, Behaviour], ...] = ()
    _exact: dict[str, Behaviour] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._exact.update((k, b) for k, b in self.rules if not _is_glob(k))

    def lookup(self, name: str) -> Behaviour | None:
        """The behaviour for ``name``: an exact key, else the first glob that matches, else None."""
        exact = self._exact.get(name)
        if exact is not None:
            return exact
        for pattern, behaviour in self.rules:
            if fnmatch.fnmatchcase(name, pattern):
                return behaviour
        return None

    def as_json(self) -> dict[str, dict[str, Any]]:
        return {k: asdict(b) for k, b in self.rules}

    def __bool__(self) -> bool:
        return bool(self.rules)


def _is_glob(key: str) -> bool:
    return any(ch in key for ch in "*?[")


def _glob_problem(key: str) -> str | None:
    if not key:
        return "an empty key matches no adapter"
    if len(key) > _MAX_KEY_LEN:
        return f"key {key[:40]!r}… is longer than {_MAX_KEY_LEN} characters"
    if _CONTROL.search(key):
        return f"key {key!r} holds a control character"
    if key != key.strip():
        return f"key {key!r} has leading or trailing whitespace (lora names have none)"
    i = 0
    while i < len(key):  # every '[' opens a character class that is closed (fnmatch's rules)
        if key[i] == "[":
            j = i + 1
            if j < len(key) and key[j] == "!":
                j += 1
            if j < len(key) and key[j] == "]":
                j += 1  # a leading ']' is a literal member, as in fnmatch
            close = key.find("]", j)
            if close < 0:
                return f"key {key!r}: '[' at position {i} is never closed"
            i = close
        i += 1
    return None


def _rate(where: str, name: str, value: Any, problems: list[str]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        problems.append(f"{where}.{name} must be a number in [0, 1], got {json.dumps(value)}")
        return 0.0
    if not 0.0 <= value <= 1.0:
        problems.append(f"{where}.{name} must be in [0, 1], got {value}")
        return 0.0
    return float(value)


def parse_behaviours(obj: Any) -> BehaviourSet:
    """Validate a behaviour object (already JSON-decoded); ``BehaviourError`` lists every problem."""
    if obj is None:
        return BehaviourSet()
    if not isinstance(obj, dict):
        kind = type(obj).__name__
        raise BehaviourError([f"behaviours must be a JSON object (glob -> behaviour), got {kind}"])
    problems: list[str] = []
    rules: list[tuple[str, Behaviour]] = []
    for key, spec in obj.items():
        where = f"[{json.dumps(key)}]"
        bad_key = _glob_problem(key)
        if bad_key:
            problems.append(bad_key)
        if not isinstance(spec, dict):
            problems.append(f"{where} must be an object with {', '.join(_FIELDS)}")
            continue
        unknown = sorted(set(spec) - set(_FIELDS))
        if unknown:
            problems.append(f"{where} has unknown key(s) {unknown}; allowed: {list(_FIELDS)}")
        error_rate = _rate(where, "error_rate", spec.get("error_rate", 0.0), problems)
        refusal_rate = _rate(where, "refusal_rate", spec.get("refusal_rate", 0.0), problems)
        stream_error_rate = _rate(where, "stream_error_rate", spec.get("stream_error_rate", 0.0), problems)
        factor = spec.get("latency_factor", 1.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor):
            problems.append(f"{where}.latency_factor must be a number, got {json.dumps(factor)}")
            factor = 1.0
        elif not 1.0 <= factor <= _MAX_LATENCY_FACTOR:
            problems.append(
                f"{where}.latency_factor must be in [1, {_MAX_LATENCY_FACTOR:g}] (the simulator can only "
                f"slow answers down; slow the other adapters to make one faster), got {factor}"
            )
            factor = 1.0
        output = spec.get("output", "text")
        if output not in OUTPUTS:
            problems.append(f"{where}.output must be one of {list(OUTPUTS)}, got {json.dumps(output)}")
            output = "text"
        if not problems:
            rules.append((key, Behaviour(error_rate, float(factor), refusal_rate, output, stream_error_rate)))
    if problems:
        raise BehaviourError(problems)
    return BehaviourSet(tuple(rules))


def load_behaviours(source: str) -> BehaviourSet:
    """``source`` is an inline JSON object (its first non-blank character is ``{``) or the path
    of a file holding one; an empty string means none."""
    text = source.strip()
    if not text:
        return BehaviourSet()
    if not text.startswith("{"):
        path = Path(text).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise BehaviourError([f"cannot read behaviours file {str(path)!r}: {reason}"]) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BehaviourError([f"behaviours are not valid JSON: {exc}"]) from None
    return parse_behaviours(obj)


@dataclass(frozen=True, slots=True)
class Draws:
    """Deterministic uniform numbers for one request: ``draw(purpose, index)`` in ``[0, 1)``."""

    key: bytes

    @classmethod
    def for_request(cls, served: str, prompts: list[str], seed: int | None) -> Draws:
        if seed is None:
            return cls(os.urandom(16))
        h = hashlib.blake2b(digest_size=16)
        for part in (served, str(seed), *prompts):
            h.update(part.encode())
            h.update(b"\x00")
        return cls(h.digest())

    def draw(self, purpose: str, index: int = 0) -> float:
        d = hashlib.blake2b(self.key + f"\x00{purpose}\x00{index}".encode(), digest_size=8).digest()
        return int.from_bytes(d, "little") / 2.0**64
