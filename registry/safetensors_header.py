"""Streaming, strict parser of a safetensors file's header (never holds the tensor data).

Format (https://github.com/huggingface/safetensors): 8-byte little-endian ``N``, then ``N``
bytes of UTF-8 JSON (an object; ``__metadata__`` maps str → str, every other key is a tensor
``{"dtype", "shape", "data_offsets": [begin, end]}`` with offsets relative to the start of
the data area), then the data area. Like the ``safetensors`` library, we require the
tensors to tile the data area exactly: offsets inside it, no overlap, no hole, byte count of
each tensor ``prod(shape) * dtype size``, and the data area neither shorter (truncated) nor
longer than the last tensor's end.

Use it by feeding chunks as they stream by::

    p = SafetensorsHeaderParser()
    for chunk in stream:
        p.feed(chunk)
    info = p.finish()          # info.problems lists everything wrong (empty when fine)
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
DEFAULT_MAX_HEADER_BYTES = 100 * 1024 * 1024
_PREFIX = "adapter_model.safetensors"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    start: int  # offset in the data area
    end: int


@dataclass
class SafetensorsInfo:
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    total_size: int = 0  # bytes of the whole file
    problems: list[str] = field(default_factory=list)
    metadata: dict[str, Any] | None = None

    @property
    def header_ok(self) -> bool:
        """True when the header itself parsed (tensor-level problems may still exist)."""
        return not any(p.startswith(f"{_PREFIX}: header") for p in self.problems)


class SafetensorsHeaderParser:
    """Push parser: ``feed(chunk)`` for every chunk, then ``finish()``.

    Keeps only the 8-byte length and the JSON header in memory; counts every byte.
    """

    def __init__(self, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES) -> None:
        self._max_header = max_header_bytes
        self._buf = bytearray()
        self._header_len: int | None = None
        self._header: bytes | None = None
        self._too_long = False
        self._total = 0
        self._finished = False

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        n = len(chunk)
        self._total += n
        if self._header is not None or self._too_long or n == 0:
            return
        if self._header_len is None:
            need = 8 - len(self._buf)
            self._buf += chunk[:need]
            if len(self._buf) < 8:
                return
            self._header_len = struct.unpack("<Q", bytes(self._buf))[0]
            self._buf = bytearray()
            if self._header_len > self._max_header:
                self._too_long = True
                return
            chunk = chunk[need:]
        need = self._header_len - len(self._buf)
        if need > 0:
            self._buf += chunk[:need]
        if len(self._buf) >= self._header_len:
            self._header = bytes(self._buf)
            self._buf = bytearray()

    def finish(self) -> SafetensorsInfo:
        self._finished = True
        info = SafetensorsInfo(total_size=self._total)
        p = info.problems
        if self._header_len is None:
            p.append(f"{_PREFIX}: header is missing: file has {self._total} bytes, fewer than 8")
            return info
        if self._too_long:
            p.append(
                f"{_PREFIX}: header length {self._header_len} is larger than the limit "
                f"of {self._max_header} bytes"
            )
            return info
        if self._header is None:
            p.append(
                f"{_PREFIX}: header length {self._header_len} runs past the end of the file "
                f"({self._total} bytes)"
            )
            return info
        _parse_header(self._header, self._total - 8 - self._header_len, info)
        return info


def parse_bytes(data: bytes) -> SafetensorsInfo:
    """Parse a whole file held in memory (tests, small files)."""
    parser = SafetensorsHeaderParser()
    parser.feed(data)
    return parser.finish()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _parse_header(raw: bytes, data_len: int, info: SafetensorsInfo) -> None:
    p = info.problems
    try:
        obj = json.loads(
            raw.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_no_duplicates
        )
    except (UnicodeDecodeError, ValueError) as e:
        p.append(f"{_PREFIX}: header is not valid JSON: {e}")
        return
    except RecursionError:  # nested deep enough to exhaust json's recursion: bad input, not a 500
        p.append(f"{_PREFIX}: header is not valid JSON: nested too deeply")
        return
    if not isinstance(obj, dict):
        p.append(f"{_PREFIX}: header is not a JSON object")
        return
    spans: list[tuple[int, int, str]] = []
    for name, entry in obj.items():
        if name == "__metadata__":
            if entry is not None and not (
                isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())
            ):
                p.append(f"{_PREFIX}: __metadata__ must map strings to strings")
            else:
                info.metadata = entry
            continue
        t = _tensor_entry(name, entry, data_len, p)
        if t is not None:
            info.tensors[name] = t
            spans.append((t.start, t.end, name))
    _check_layout(spans, data_len, p)


def _tensor_entry(name: str, entry: Any, data_len: int, p: list[str]) -> TensorInfo | None:
    where = f"{_PREFIX}: tensor {name!r}"
    if not isinstance(entry, dict):
        p.append(f"{where}: entry is not an object")
        return None
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offs = entry.get("data_offsets")
    ok = True
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        p.append(f"{where}: unknown dtype {dtype!r}")
        ok = False
    if not (isinstance(shape, list) and all(_is_uint(d) for d in shape)):
        p.append(f"{where}: shape {shape!r} is not a list of non-negative integers")
        ok = False
    if not (isinstance(offs, list) and len(offs) == 2 and all(_is_uint(o) for o in offs)):
        p.append(f"{where}: data_offsets {offs!r} is not a pair of non-negative integers")
        return None
    start, end = int(offs[0]), int(offs[1])
    if end < start:
        p.append(f"{where}: data_offsets [{start}, {end}] end before they begin")
        return None
    if end > data_len:
        p.append(
            f"{where}: data_offsets [{start}, {end}] lie outside the data area of {max(data_len, 0)} "
            f"bytes (file truncated or offsets wrong)"
        )
    if ok:
        assert isinstance(shape, list) and isinstance(dtype, str)
        want = math.prod(shape) * DTYPE_SIZES[dtype]
        if end - start != want:
            p.append(f"{where}: holds {end - start} bytes but shape {shape} of {dtype} needs {want} bytes")
        return TensorInfo(dtype=dtype, shape=tuple(int(d) for d in shape), start=start, end=end)
    return None


def _check_layout(spans: list[tuple[int, int, str]], data_len: int, p: list[str]) -> None:
    spans.sort()
    pos = 0
    prev = ""
    for start, end, name in spans:
        if start < pos:
            p.append(f"{_PREFIX}: tensors {prev!r} and {name!r} overlap (bytes {start}..{pos})")
        elif start > pos:
            p.append(f"{_PREFIX}: hole of {start - pos} bytes in the data area before tensor {name!r}")
        if end > pos:
            pos, prev = end, name
    if data_len < 0:
        return
    if pos < data_len:
        p.append(f"{_PREFIX}: {data_len - pos} trailing bytes after the last tensor")
    elif pos > data_len:
        p.append(f"{_PREFIX}: file is truncated: data area has {data_len} bytes, tensors need {pos}")


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
