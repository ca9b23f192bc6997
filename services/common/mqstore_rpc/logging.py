"""structlog set-up shared by every mqstore process: one JSON object per line on stderr.

Each line starts with ``timestamp`` (ISO 8601, UTC), ``level`` and ``event`` (a stable event name such
as ``server.started``), then the event's fields. Exceptions logged with ``exc_info`` appear as an
``exception`` field holding the formatted traceback. Call :func:`configure` once, from ``main()``;
library code only calls ``structlog.get_logger(...)`` and never configures anything.
"""

from __future__ import annotations

import json
import logging as std_logging
import sys
from typing import Any, TextIO

import structlog

LEVELS = ("debug", "info", "warning", "error", "critical")
_LEADING_KEYS = ("timestamp", "level", "event")


def _leading_keys_first(_logger: Any, _method: str, event_dict: dict) -> dict:
    """Puts timestamp, level and event first, so lines read the same way in a terminal."""
    ordered = {key: event_dict.pop(key) for key in _LEADING_KEYS if key in event_dict}
    ordered.update(event_dict)
    return ordered


def configure(level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog for JSON lines on ``stream`` (stderr by default). Idempotent."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _leading_keys_first,
            # default=str: paths, enums and other plain values are written as text, never dropped.
            structlog.processors.JSONRenderer(serializer=json.dumps, default=str),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(std_logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.WriteLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=True,
    )
