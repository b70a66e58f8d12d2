"""Log formatters that keep a record's structured fields (the `extra=` of a log call).

Conch logs fixed dotted event names with ids as structured fields, e.g.
`log.info("deployment.ready", extra={"deployment_id": 7})`. The standard library's
formatter drops such fields; these keep them. Chosen by CONCH_LOG_FORMAT in settings.LOGGING:

- `plain` (KeyValueFormatter): `2026-01-01 12:00:00,123 INFO deployments.services deployment.ready deployment_id=7`
- `json` (JsonFormatter): one JSON object per line,
  `{"time": "2026-01-01T12:00:00.123+00:00", "level": "INFO", "logger": "deployments.services",
  "event": "deployment.ready", "deployment_id": 7}`
"""

from __future__ import annotations

import json
import logging
import math
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has (this Python's set), plus the two Formatter.format adds;
# anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", logging.INFO, "", 0, "", (), None))) | {
    "message",
    "asctime",
}
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Keys of a JSON line that an extra field of the same name must not overwrite.
_JSON_KEYS = ("time", "level", "logger", "event", "exc_info", "stack_info")


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call passed with `extra=`, in the order given."""
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES and not k.startswith("_")}


def _plain_value(value: Any) -> str:
    text = str(value)
    # Quote (JSON string syntax) whatever would break `key=value` parsing or the one-line record.
    if not text or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


class KeyValueFormatter(logging.Formatter):
    """Plain text: the standard line (PLAIN_FORMAT by default), then ` key=value` per extra field.

    Values with spaces, quotes, `=` or line breaks are written as JSON strings
    (`error="Triton did not start\\nlast lines: ..."`), so one record stays one line;
    a traceback still follows on the next lines, as with logging.Formatter.
    """

    def __init__(self, fmt: str | None = PLAIN_FORMAT, datefmt: str | None = None, **kwargs: Any) -> None:
        super().__init__(fmt, datefmt, **kwargs)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        line = super().formatMessage(record)
        fields = extra_fields(record)
        if not fields:
            return line
        return line + " " + " ".join(f"{key}={_plain_value(value)}" for key, value in fields.items())


def _json_safe(value: Any) -> Any:
    # NaN and infinities are not JSON; a log line must stay parseable.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC, ms), level, logger, event (the message), extra fields.

    An extra field named like one of those keys is written as `extra_<name>`. A traceback
    goes in `exc_info` (and a stack in `stack_info`) as one string. Values JSON cannot hold
    are written as their str().
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            line[f"extra_{key}" if key in _JSON_KEYS else key] = _json_safe(value)
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)
