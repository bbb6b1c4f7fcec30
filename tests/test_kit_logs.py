"""kit.logs.StepBufferedStreamHandler: one write per event-loop step, nothing held past it."""

from __future__ import annotations

import asyncio
import logging

import orjson

from kit.logs import JsonFormatter, StepBufferedStreamHandler


class CountingStream:
    def __init__(self) -> None:
        self.writes: list[str] = []
        self.flushes = 0

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        self.flushes += 1


def _logger(name: str) -> tuple[logging.Logger, CountingStream, StepBufferedStreamHandler]:
    stream = CountingStream()
    handler = StepBufferedStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"test.kit.logs.{name}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream, handler


def _messages(stream: CountingStream) -> list[str]:
    return [orjson.loads(line)["msg"] for w in stream.writes for line in w.splitlines()]


def test_without_a_running_loop_every_line_is_written_at_once() -> None:
    logger, stream, _ = _logger("noloop")
    logger.info("one")
    assert stream.writes and _messages(stream) == ["one"]
    logger.info("two")
    assert len(stream.writes) == 2


def test_lines_of_one_loop_step_go_out_in_one_write_after_the_step() -> None:
    logger, stream, _ = _logger("step")

    async def main() -> None:
        for i in range(5):
            logger.info("line %d", i, extra={"n": i})
        assert stream.writes == []  # held until the step ends
        await asyncio.sleep(0)  # the flush runs before the next step of this task
        assert len(stream.writes) == 1
        assert _messages(stream) == [f"line {i}" for i in range(5)]
        logger.info("next")
        await asyncio.sleep(0)
        assert len(stream.writes) == 2

    asyncio.run(main())
    lines = [orjson.loads(x) for w in stream.writes for x in w.splitlines()]
    assert [x.get("n") for x in lines[:5]] == [0, 1, 2, 3, 4]  # the fields are unchanged


def test_a_warning_writes_what_is_held_first_and_itself_at_once() -> None:
    logger, stream, _ = _logger("warn")

    async def main() -> None:
        logger.info("held")
        logger.warning("urgent")
        assert _messages(stream) == ["held", "urgent"]  # in order, without waiting for the step
        logger.info("after")
        await asyncio.sleep(0)
        assert _messages(stream) == ["held", "urgent", "after"]

    asyncio.run(main())


def test_flush_writes_what_is_held_and_a_closed_loop_loses_nothing() -> None:
    logger, stream, handler = _logger("flush")

    async def main() -> None:
        logger.info("a")
        handler.flush()
        assert _messages(stream) == ["a"]
        logger.info("b")  # the loop ends right after: the scheduled flush still runs

    asyncio.run(main())
    handler.flush()
    assert _messages(stream) == ["a", "b"]


def test_lines_from_a_thread_without_a_loop_are_written_in_order() -> None:
    logger, stream, _ = _logger("thread")

    async def main() -> None:
        logger.info("loop line")
        await asyncio.to_thread(logger.info, "thread line")  # no loop there: written at once, after
        logger.info("later")
        await asyncio.sleep(0)

    asyncio.run(main())
    assert _messages(stream) == ["loop line", "thread line", "later"]


def test_log_record_keeps_the_extra_fields_as_attributes_and_refuses_reserved_names() -> None:
    import pytest

    from kit.logs import log_record

    logger, stream, _ = _logger("record")
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger.addHandler(Keep())
    log_record(logger, logging.INFO, "request", {"status": 200, "tenant": "t"})
    line = orjson.loads(stream.writes[-1])
    assert line["msg"] == "request" and line["status"] == 200 and line["tenant"] == "t"
    assert seen[-1].status == 200  # type: ignore[attr-defined]  # another handler sees them as attributes
    with pytest.raises(KeyError, match="message"):
        log_record(logger, logging.INFO, "x", {"message": "clash"})
