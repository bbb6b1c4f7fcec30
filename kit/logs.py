"""Structured logging: one JSON object per line, extra fields passed through ``extra={...}``."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any

import orjson

_RESERVED = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    _second: tuple[int, str] = (-1, "")  # the last formatted second (one strftime a second)

    def format(self, record: logging.LogRecord) -> str:
        sec = int(record.created)
        second = self._second
        if second[0] != sec:
            second = self._second = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
        out: dict[str, Any] = {
            "ts": f"{second[1]}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = record.__dict__.get("_fields")
        if fields is not None:  # log_record's: the extra fields as given, no scan of the record
            out.update(fields)
        else:
            for key, value in record.__dict__.items():
                if key not in _RESERVED and not key.startswith("_"):
                    out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def log_record(logger: logging.Logger, level: int, msg: str, extra: dict[str, Any]) -> None:
    """``logger.log(level, msg, extra=extra)`` for hot paths: the record says ``(unknown file)``
    instead of the caller's file and line (what logging does without caller lookup), which
    spares the frame walk; the JSON line is the same, as it never shows them."""
    if logger.isEnabledFor(level):
        record = logger.makeRecord(
            logger.name, level, "(unknown file)", 0, msg, (), None, "(unknown function)"
        )
        attrs = record.__dict__
        if not _RESERVED.isdisjoint(extra):  # what makeRecord(extra=...) refuses
            raise KeyError(f"Attempt to overwrite {sorted(_RESERVED.intersection(extra))} in LogRecord")
        attrs.update(extra)  # as attributes too, for any other handler
        attrs["_fields"] = extra
        logger.handle(record)


class StepBufferedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that, inside a running event loop, writes the lines of one loop step
    together: the first line of a step schedules a flush (``call_soon``), the others join it, so a
    serving process under load makes one ``write`` per step instead of one per request. Nothing
    waits: the lines go out as soon as the step's other callbacks have run. Records at WARNING and
    above, records from threads without a running loop, ``flush()`` and ``close()`` (so
    ``logging.shutdown`` at exit) write what is held at once, in order."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._held: list[str] = []
        self._held_loop: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
            loop = _running_loop()
            if loop is None or record.levelno >= logging.WARNING:
                self._held.append(line)
                self._write_held()
                return
            if self._held_loop is not loop:
                if self._held:
                    self._write_held()
                self._held_loop = loop
            if not self._held:
                loop.call_soon(self.flush)
            self._held.append(line)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def _write_held(self) -> None:
        held, self._held = self._held, []
        if held and self.stream is not None:
            self.stream.write(held[0] if len(held) == 1 else "".join(held))
            if hasattr(self.stream, "flush"):
                self.stream.flush()

    def flush(self) -> None:
        self.acquire()
        try:
            if self._held:
                self._write_held()
            elif self.stream is not None and hasattr(self.stream, "flush"):
                self.stream.flush()
        finally:
            self.release()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def setup_logging(level: str = "INFO", json_logs: bool = True) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = StepBufferedStreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Neither line format shows thread, process or process name: records skip looking them up
    # (a getpid system call, the current thread, the multiprocessing module, on every record).
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    noisy_loggers = ("botocore", "boto3", "s3transfer", "urllib3", "httpx", "httpcore", "uvicorn.access")
    for noisy in (*noisy_loggers, "alembic.runtime.plugins"):  # alembic: a line per plugin at start
        logging.getLogger(noisy).setLevel(logging.WARNING)
