"""The streaming multipart/form-data parser (``registry.ingest.formdata``): every split of a body
into chunks gives the same parts, delimiters split across chunks at every offset, CRLF and
near-delimiter edge cases, preamble and epilogue, malformed and oversized bodies; and its
``find`` agrees with ``bytes.find``. python-multipart (the parser it replaced) is the oracle for
well-formed random bodies."""

from __future__ import annotations

import random
from typing import Any

import pytest
from python_multipart.multipart import MultipartParser

from registry.ingest import formdata
from registry.ingest.formdata import (
    END,
    MAX_HEADER_LINE,
    MAX_HEADERS,
    MAX_PREAMBLE,
    PART_END,
    FormDataError,
    FormDataParser,
    Part,
    check_boundary,
    find,
)

B = b"lpb0undary-7d1f"
DELIM = b"\r\n--" + B


def part(name: str, data: bytes, filename: str | None = "f.bin", extra: bytes = b"") -> bytes:
    disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return (
        b"--" + B + b"\r\nContent-Disposition: " + disp.encode() + b"\r\n" + extra + b"\r\n" + data + b"\r\n"
    )


def body(*parts: bytes, end: bytes = b"--" + B + b"--\r\n") -> bytes:
    return b"".join(parts) + end


Flat = list[Any]


def run(chunks: list[bytes], boundary: bytes = B, **kw: Any) -> Flat:
    """Feed the chunks; the events with adjacent data joined (data as bytes, Part as headers)."""
    p = FormDataParser(boundary, **kw)
    out: Flat = []
    for c in chunks:
        for ev in p.feed(c):
            if isinstance(ev, bytes):
                assert ev, "no empty data events"
                if out and isinstance(out[-1], bytearray):
                    out[-1] += ev
                else:
                    out.append(bytearray(ev))
            else:
                out.append(ev.headers if isinstance(ev, Part) else ev)
    p.finish()
    return [bytes(x) if isinstance(x, bytearray) else x for x in out]


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


TRICKY = (
    b"\r\n--"
    + B[:-1]
    + b"X"  # a near-delimiter: all but the last byte
    + b"\r\r\n\r\n-\r\n--\r\n--"
    + B[:5]  # CRs, CRLFs and dashes that start delimiter prefixes
    + b"--"
    + B
    + b"--"  # the boundary without the CRLF before it is data
    + b"\r"
)  # and the part's data ends with a CR, right before the delimiter
SAMPLE = body(
    part("files", TRICKY, extra=b"Content-Type: application/octet-stream\r\n"),
    part("quality_gate", b"pending", filename=None),
    part("files", b"", filename="empty.bin"),
)
SAMPLE_EVENTS: Flat = [
    {
        "content-disposition": 'form-data; name="files"; filename="f.bin"',
        "content-type": "application/octet-stream",
    },
    TRICKY,
    PART_END,
    {"content-disposition": 'form-data; name="quality_gate"'},
    b"pending",
    PART_END,
    {"content-disposition": 'form-data; name="files"; filename="empty.bin"'},
    PART_END,
    END,
]


def test_one_chunk_gives_the_parts_headers_and_data() -> None:
    assert run([SAMPLE]) == SAMPLE_EVENTS


@pytest.mark.parametrize("size", [1, 2, 3, 5, 17, 64, 1000])
def test_fixed_size_chunks_give_the_same_events(size: int) -> None:
    assert run(split(SAMPLE, size)) == SAMPLE_EVENTS


def test_every_split_point_of_two_chunks_gives_the_same_events() -> None:
    for i in range(len(SAMPLE) + 1):
        assert run([SAMPLE[:i], SAMPLE[i:]]) == SAMPLE_EVENTS, i


def test_a_delimiter_split_at_every_offset_across_three_chunks() -> None:
    """The data's last delimiter cut at every pair of offsets inside it (and around it)."""
    data = bytes(range(256)) * 4
    whole = body(part("files", data))
    at = whole.index(DELIM, len(data) - 10)
    want = run([whole])
    for i in range(at - 2, at + len(DELIM) + 4):
        for j in range(i, at + len(DELIM) + 4):
            assert run([whole[:i], whole[i:j], whole[j:]]) == want, (i, j)


def test_a_chunk_of_pure_data_is_passed_on_without_copying() -> None:
    p = FormDataParser(B)
    head = part("files", b"")[: -len(b"\r\n")]  # headers, no data yet
    assert [type(e) for e in p.feed(head)] == [Part]
    chunk = bytes(random.Random(1).randbytes(256 * 1024)).replace(b"\r", b"x")
    (ev,) = p.feed(chunk)
    assert ev is chunk
    assert p.feed(b"\r\n--" + B + b"--") == [PART_END, END] and p.done


def test_data_that_ends_like_a_delimiter_prefix_is_held_then_released() -> None:
    p = FormDataParser(B)
    p.feed(part("files", b"")[:-2])
    assert p.feed(b"abc\r\n--" + B[:4]) == [b"abc"]  # the possible delimiter start is held back
    assert p.feed(b"zz") == [b"\r\n--" + B[:4], b"zz"]  # not one after all: data, in order
    assert p.feed(b"\r") == []
    assert p.feed(b"\n--" + B + b"--") == [PART_END, END]


def test_preamble_and_epilogue_are_ignored() -> None:
    events = run(
        [b"This is the preamble.\r\nIt is to be ignored.\r\n" + SAMPLE + b"epilogue\r\n--" + B + b"\r\n"]
    )
    assert events == SAMPLE_EVENTS
    assert run([b"\r\n" + SAMPLE]) == SAMPLE_EVENTS  # a leading CRLF (an empty preamble)
    tail = b"epilogue ignored" * 1000
    p = FormDataParser(B)
    assert p.feed(SAMPLE)[-1] is END and p.feed(tail) == [] and p.done


def test_a_long_preamble_or_no_boundary_at_all_is_refused() -> None:
    pre = b"x" * (MAX_PREAMBLE + 100)
    with pytest.raises(FormDataError, match="no boundary in the first"):
        run(split(pre + SAMPLE, 1000))
    assert run([b"y" * (MAX_PREAMBLE - 10) + b"\r\n" + SAMPLE]) == SAMPLE_EVENTS  # just under: fine
    with pytest.raises(FormDataError, match="before its closing boundary"):
        run([b"garbage that is not multipart at all\r\n"])


def test_transport_padding_after_a_boundary_is_allowed() -> None:
    padded = SAMPLE.replace(b"--" + B + b"\r\n", b"--" + B + b" \t  \r\n")
    assert run(split(padded, 3)) == SAMPLE_EVENTS
    too_much = SAMPLE.replace(b"--" + B + b"\r\n", b"--" + B + b" " * 2000 + b"\r\n", 1)
    with pytest.raises(FormDataError, match="padding"):
        run([too_much])


@pytest.mark.parametrize(
    "after",
    [b"X\r\n", b"-X", b" x\r\n", b"\rX", b"\n"],
    ids=["letter", "single-dash", "padding-then-text", "cr-without-lf", "bare-lf"],
)
def test_a_delimiter_followed_by_neither_crlf_nor_dashes_is_refused(after: bytes) -> None:
    bad = part("files", b"data")[:-2] + DELIM + after + b"rest\r\n--" + B + b"--"
    for size in (len(bad), 1, 7):
        with pytest.raises(FormDataError, match="neither CRLF nor '--'"):
            run(split(bad, size))


@pytest.mark.parametrize(
    "cut",
    [
        b"--" + B,  # the first boundary line, unfinished
        b"--" + B + b"\r\nContent-Disposition: form-data",  # inside the headers
        part("files", b"some data")[:-2],  # inside the data
        part("files", b"some data")[:-2] + DELIM,  # the delimiter, without what follows
        part("files", b"some data")[:-2] + DELIM + b"-",  # half of the closing dashes
        part("files", b"some data"),  # a part, and no closing delimiter
    ],
)
def test_a_body_without_its_closing_delimiter_is_refused(cut: bytes) -> None:
    with pytest.raises(FormDataError, match="before its closing boundary"):
        run([cut])
    with pytest.raises(FormDataError, match="before its closing boundary"):
        run(split(cut, 1))


def test_an_empty_message_and_a_part_without_headers() -> None:
    assert run([b"--" + B + b"--"]) == [END]
    assert run([b"--" + B + b"\r\n\r\nbare\r\n--" + B + b"--"]) == [{}, b"bare", PART_END, END]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (b"NoColonHere\r\n", "no colon"),
        (b": empty name\r\n", "bad part header name"),
        (b"Bad Name: x\r\n", "bad part header name"),
        (b"X-A: value\x00with NUL\r\n", "control character"),
        (b"X-A: bare\nLF\r\n", "control character"),
        (b" folded: x\r\n", "bad part header name"),
        ("".join(f"X-{i}: v\r\n" for i in range(MAX_HEADERS)).encode(), f"more than {MAX_HEADERS} headers"),
        (b"X-Long: " + b"v" * MAX_HEADER_LINE + b"\r\n", "longer than"),
    ],
)
def test_malformed_or_excess_part_headers_are_refused(headers: bytes, message: str) -> None:
    bad = (
        b"--"
        + B
        + b'\r\nContent-Disposition: form-data; name="files"\r\n'
        + headers
        + b"\r\ndata\r\n--"
        + B
        + b"--"
    )
    for size in (len(bad), 5):
        with pytest.raises(FormDataError, match=message):
            run(split(bad, size))


def test_header_names_are_case_insensitive_and_values_stripped() -> None:
    hdr = b'CONTENT-disposition:   form-data; name="files"; filename="a"\t \r\nX-Tab:\tv\r\n'
    events = run([b"--" + B + b"\r\n" + hdr + b"\r\nd\r\n--" + B + b"--"])
    assert events[0] == {"content-disposition": 'form-data; name="files"; filename="a"', "x-tab": "v"}


def test_an_endless_header_block_is_refused_without_buffering_it_all() -> None:
    p = FormDataParser(B)
    p.feed(b"--" + B + b"\r\nX-A: " + b"a" * 100)
    with pytest.raises(FormDataError, match="too large"):
        for _ in range(1000):
            p.feed(b"b" * 1000)  # no CRLF CRLF ever
    assert len(p._buf) < 64 * 1024


def test_the_boundary_must_be_printable_ascii() -> None:
    assert check_boundary(b"----WebKitFormBoundary7MA4YWxkTrZu0gW") and check_boundary(b"a b")
    for bad in (b"", b"x" * 201, b"a\r\nb", b"tab\there", b"\xff"):
        assert not check_boundary(bad)
        with pytest.raises(FormDataError):
            FormDataParser(bad)


def test_memoryview_and_bytearray_chunks_are_accepted() -> None:
    assert run([bytearray(SAMPLE[:50]), memoryview(SAMPLE)[50:]]) == SAMPLE_EVENTS  # type: ignore[list-item]


# --------------------------------------------------------------------------- find


@pytest.mark.parametrize("use_memmem", [True, False])
def test_find_agrees_with_bytes_find(monkeypatch: pytest.MonkeyPatch, use_memmem: bool) -> None:
    if not use_memmem:
        monkeypatch.setattr(formdata, "_memmem", None)
    elif formdata._memmem is None:
        pytest.skip("no memmem in this C library")
    rng = random.Random(7)
    needle = DELIM
    for trial in range(300):
        n = rng.choice([0, 10, 5000, 70_000])
        hay = bytearray(rng.randbytes(n))
        for _ in range(rng.randrange(3)):  # plant whole and partial needles
            at = rng.randrange(n + 1)
            hay[at:at] = needle[: rng.randrange(1, len(needle) + 1)]
        data = bytes(hay)
        start = rng.randrange(len(data) + 1)
        end = rng.randrange(start, len(data) + 1)
        assert find(data, needle, start, end) == data.find(needle, start, end), trial
    big = b"a" * 100_000 + needle + b"b" * 10
    assert find(big, needle, 0, len(big)) == 100_000
    assert find(big, needle, 100_001, len(big)) == -1
    assert find(big, needle, 0, 100_000 + len(needle) - 1) == -1  # the end bounds the match


# --------------------------------------------------------------------------- oracle


def oracle(data: bytes, boundary: bytes) -> Flat:
    """python-multipart's view of a well-formed body, in the same shape as ``run``."""
    out: Flat = []
    hdr: dict[str, str] = {}
    field = bytearray()
    value = bytearray()

    def on_part_begin() -> None:
        hdr.clear()

    def on_header_field(d: bytes, s: int, e: int) -> None:
        field.extend(d[s:e])

    def on_header_value(d: bytes, s: int, e: int) -> None:
        value.extend(d[s:e])

    def on_header_end() -> None:
        hdr[field.decode().lower()] = value.decode("latin-1").strip()
        field.clear()
        value.clear()

    def on_headers_finished() -> None:
        out.append(dict(hdr))

    def on_part_data(d: bytes, s: int, e: int) -> None:
        if e > s:
            if isinstance(out[-1], bytearray):
                out[-1] += d[s:e]
            else:
                out.append(bytearray(d[s:e]))

    def on_part_end() -> None:
        out.append(PART_END)

    def on_end() -> None:
        out.append(END)

    cb = {k: v for k, v in locals().items() if k.startswith("on_")}
    p = MultipartParser(boundary, cb)  # type: ignore[arg-type]
    p.write(data)
    return [bytes(x) if isinstance(x, bytearray) else x for x in out]


def test_random_well_formed_bodies_match_python_multipart() -> None:
    rng = random.Random(2024)
    for trial in range(200):
        boundary = rng.choice(
            [B, b"x", b"----WebKitFormBoundary7MA4YWxkTrZu0gW", rng.randbytes(8).hex().encode()]
        )
        delim = b"\r\n--" + boundary
        pieces = [b"\r", b"\n", b"-", b"x", *(delim[:k] for k in range(1, len(delim)))]
        parts = []
        for k in range(rng.randrange(0, 4)):
            if rng.random() < 0.5:  # delimiter prefixes, CRs, LFs and dashes, to trip the search up
                data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 60)))
            else:
                data = rng.randbytes(rng.randrange(0, 5000))
            while delim in data:  # near-delimiters stay
                data = data.replace(delim, b"--" + boundary)
            parts.append(
                b"--"
                + boundary
                + b'\r\nContent-Disposition: form-data; name="f%d"\r\n\r\n' % k
                + data
                + b"\r\n"
            )
        whole = b"".join(parts) + b"--" + boundary + b"--\r\n"
        want = oracle(whole, boundary)
        sizes = [len(whole) or 1, 1, rng.randrange(1, 50), rng.randrange(1, 5000)]
        for size in sizes:
            assert run(split(whole, size), boundary) == want, (trial, size)
