"""A streaming ``multipart/form-data`` parser (RFC 7578, RFC 2046 §5.1) for large uploads.

``FormDataParser.feed(chunk)`` returns the events the chunk completes, in order: a
:class:`Part` when a part's headers have been read, its data as ``bytes`` (a received chunk
that holds nothing but data is passed on as is, not copied), :data:`PART_END` when the part
ends, :data:`END` after the closing delimiter. ``finish()`` raises if the body ended before it.

The delimiter is searched for over whole chunks at C speed (glibc's ``memmem`` where the C
library has it, else ``bytes.find``); a delimiter split across chunks is found too (its first
bytes are held back until the next chunk decides). Everything else is small and bounded: the
preamble before the first boundary (``max_preamble``), each part's header block
(``max_headers`` lines of at most ``max_header_line`` bytes). Anything malformed raises
:class:`FormDataError`: a delimiter followed by neither ``--`` nor (optional spaces or tabs
and) CRLF, a header line without a colon, with a bad name or a control character, too many
or too long headers, no boundary at all.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from typing import Final

CRLF = b"\r\n"
MAX_PREAMBLE = 64 * 1024
MAX_HEADERS = 8
MAX_HEADER_LINE = 4096 + 128
MAX_PADDING = 1024  # spaces / tabs allowed between a boundary and its CRLF
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but tab
_BOUNDARY = re.compile(rb"[ -~]{1,200}")  # printable ASCII: no CR / LF in a delimiter


class FormDataError(ValueError):
    """The body is not well-formed multipart/form-data."""


class Part:
    """The start of a part: its headers, names lower-cased, values stripped (latin-1)."""

    __slots__ = ("headers",)

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers

    def __repr__(self) -> str:
        return f"Part({self.headers!r})"


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


PART_END: Final = _Marker("PART_END")
END: Final = _Marker("END")
Event = Part | bytes | _Marker


def _load_memmem() -> Callable[[int, int, bytes, int], int | None] | None:
    """glibc's ``memmem``, called with the GIL held (``PyDLL``: a call is microseconds, and a
    released GIL would have to be won back from busy threads); None where there is none."""
    try:
        fn = ctypes.PyDLL(None).memmem
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    return fn  # type: ignore[no-any-return]


_memmem = _load_memmem()
_MEMMEM_FROM = 4096  # shorter searches: bytes.find (no call overhead)


def find(data: bytes, needle: bytes, start: int, end: int) -> int:
    """``data.find(needle, start, end)`` for ``0 <= start <= end <= len(data)``; faster on
    long spans where the C library has ``memmem`` (``bytes.find`` switches to its slower
    two-way search on long inputs)."""
    if _memmem is None or end - start < _MEMMEM_FROM or type(data) is not bytes:
        return data.find(needle, start, end)
    base = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value  # the bytes' own buffer
    assert base is not None
    hit = _memmem(base + start, end - start, needle, len(needle))
    return -1 if hit is None else hit - base


def check_boundary(boundary: bytes) -> bool:
    """A usable boundary: 1–200 printable ASCII characters (RFC 2046 allows 70 of a subset)."""
    return _BOUNDARY.fullmatch(boundary) is not None


class FormDataParser:
    """Push parser of one multipart/form-data body (see the module doc)."""

    _START, _PREAMBLE, _AFTER_BOUNDARY, _HEADERS, _DATA, _EPILOGUE = range(6)

    def __init__(
        self,
        boundary: bytes,
        *,
        max_preamble: int = MAX_PREAMBLE,
        max_headers: int = MAX_HEADERS,
        max_header_line: int = MAX_HEADER_LINE,
    ) -> None:
        if not check_boundary(boundary):
            raise FormDataError("the boundary must be 1 to 200 printable ASCII characters")
        self._dash = b"--" + boundary  # the first boundary line, at the very start
        self._delim = CRLF + self._dash  # every later one
        self._max_preamble = max_preamble
        self._max_headers = max_headers
        self._max_header_line = max_header_line
        self._max_block = max_headers * (max_header_line + 2) + 2
        self._state = self._START
        self._buf = b""  # unparsed bytes of a small state (preamble, boundary line, headers)
        self._carry = b""  # data state: the chunk's end that may start a delimiter
        self._preamble = 0
        self._in_part = False

    @property
    def done(self) -> bool:
        """The closing delimiter has been read."""
        return self._state == self._EPILOGUE

    def feed(self, chunk: bytes) -> list[Event]:
        """Parse the next chunk of the body; the events it completes, in order."""
        if type(chunk) is not bytes:
            chunk = bytes(chunk)
        events: list[Event] = []
        pos, n = 0, len(chunk)
        while pos < n:
            if self._state == self._DATA:
                pos = self._scan(chunk, pos, events)
            elif self._state == self._EPILOGUE:
                break  # ignored (RFC 2046: the epilogue is to be disregarded)
            else:
                pos = self._small(chunk, pos, events)
        return events

    def finish(self) -> None:
        """The body has ended: raise unless it was complete."""
        if self._state != self._EPILOGUE:
            raise FormDataError("the body ended before its closing boundary")

    # ----------------------------------------------------------------- part data (large)

    def _scan(self, chunk: bytes, pos: int, events: list[Event]) -> int:
        """Data state: pass data on up to the next delimiter (then return just past it, in the
        boundary-line state) or to the chunk's end (holding back a possible partial delimiter)."""
        delim, n = self._delim, len(chunk)
        if self._carry:
            carry, self._carry = self._carry, b""
            got = carry + chunk[pos : pos + len(delim) - len(carry)]
            if delim.startswith(got):
                if len(got) < len(delim):  # a tiny chunk: still undecided
                    self._carry = got
                    return n
                self._state = self._AFTER_BOUNDARY  # the delimiter was split across chunks
                return pos + len(delim) - len(carry)
            events.append(carry)  # not a delimiter after all: data
        hit = find(chunk, delim, pos, n)
        if hit >= 0:
            if hit > pos:
                events.append(chunk[pos:hit])
            self._state = self._AFTER_BOUNDARY
            return hit + len(delim)
        # a delimiter can only start at a CR (the boundary has none): only the last CR near
        # the end can begin one that the next chunk completes
        end = n
        cr = chunk.rfind(b"\r", max(pos, n - len(delim) + 1), n)
        if cr >= 0 and delim.startswith(chunk[cr:]):
            end, self._carry = cr, chunk[cr:]
        if end > pos:
            events.append(chunk if pos == 0 and end == n else chunk[pos:end])
        return n

    # ---------------------------------------------------- preamble, boundary line, headers

    def _small(self, chunk: bytes, pos: int, events: list[Event]) -> int:
        """The small states (preamble, boundary line, headers) over what earlier chunks left
        plus a bounded slice of this one; returns where in ``chunk`` parsing goes on."""
        take = chunk[pos : pos + self._max_block + len(self._delim) + MAX_PADDING + 4]
        old = len(self._buf)
        data = self._buf + take if old else take
        i = 0
        while True:
            state = self._state
            j = self._step(data, i, events)
            if self._state in (self._DATA, self._EPILOGUE):
                # what ends a small state ends in ``take``: earlier bytes were parsed as far
                # as they went when they arrived
                assert j > old
                self._buf = b""
                return pos + j - old
            if j == i and self._state == state:  # no progress: needs more bytes
                self._buf = data[i:]
                return pos + len(take)
            i = j

    def _step(self, data: bytes, i: int, events: list[Event]) -> int:
        """One step of a small state from ``data[i:]``: the index after what it used (``i``
        itself, state unchanged, when it needs more bytes)."""
        st = self._state
        if st == self._START:
            dash = self._dash
            if data.startswith(dash, i):
                self._state = self._AFTER_BOUNDARY
                return i + len(dash)
            if len(data) - i < len(dash) and dash.startswith(data[i:]):
                return i
            self._state = self._PREAMBLE
            return i
        if st == self._PREAMBLE:
            hit = data.find(self._delim, i)
            # the preamble ends at the delimiter, or goes on at least to what cannot start one
            end = hit if hit >= 0 else max(i, len(data) - len(self._delim) + 1)
            self._preamble += end - i
            if self._preamble > self._max_preamble:
                raise FormDataError(f"no boundary in the first {self._max_preamble} bytes")
            if hit >= 0:
                self._state = self._AFTER_BOUNDARY
                return hit + len(self._delim)
            return end
        if st == self._AFTER_BOUNDARY:
            return self._boundary_line(data, i, events)
        return self._headers(data, i, events)

    def _boundary_line(self, data: bytes, i: int, events: list[Event]) -> int:
        """After a boundary: ``--`` ends the body, else optional spaces / tabs, then CRLF."""
        n = len(data)
        if i < n and data[i] == 0x2D:  # "-"
            if i + 1 == n:
                return i
            if data[i + 1] != 0x2D:
                raise FormDataError("a boundary is followed by neither CRLF nor '--'")
            if self._in_part:
                events.append(PART_END)
            events.append(END)
            self._in_part = False
            self._state = self._EPILOGUE
            return i + 2
        j = i
        while j < n and data[j] in b" \t":
            j += 1
        if j - i > MAX_PADDING:
            raise FormDataError("too much padding after a boundary")
        if j + 2 > n:
            if data[j:] in (b"", b"\r"):
                return i
        elif data[j : j + 2] == CRLF:
            if self._in_part:
                events.append(PART_END)
            self._in_part = False
            self._state = self._HEADERS
            return j + 2
        raise FormDataError("a boundary is followed by neither CRLF nor '--'")

    def _headers(self, data: bytes, i: int, events: list[Event]) -> int:
        if data.startswith(CRLF, i):  # a part without headers
            end, stop = i, i + 2
        else:
            end = data.find(b"\r\n\r\n", i)
            if end < 0:
                if len(data) - i > self._max_block:
                    raise FormDataError("a part's headers are too large")
                return i
            stop = end + 4
        if end - i > self._max_block:
            raise FormDataError("a part's headers are too large")
        events.append(Part(self._parse_headers(data[i:end])))
        self._in_part = True
        self._state = self._DATA
        return stop

    def _parse_headers(self, block: bytes) -> dict[str, str]:
        headers: dict[str, str] = {}
        if not block:
            return headers
        lines = block.split(CRLF)
        if len(lines) > self._max_headers:
            raise FormDataError(f"a part has more than {self._max_headers} headers")
        for line in lines:
            if len(line) > self._max_header_line:
                raise FormDataError(f"a part header is longer than {self._max_header_line} bytes")
            name, colon, value = line.partition(b":")
            if not colon:
                raise FormDataError("a part header line has no colon")
            if not _TOKEN.fullmatch(name):
                raise FormDataError(f"bad part header name {name[:64]!r}")
            if _BAD_VALUE.search(value):
                raise FormDataError(f"control character in part header {name.decode('ascii')!r}")
            headers[name.decode("ascii").lower()] = value.strip(b" \t").decode("latin-1")
        return headers
