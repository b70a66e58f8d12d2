"""Log lines keep the structured fields of a log call (`extra=`), as key=value or as JSON lines."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conch.logging import JsonFormatter, KeyValueFormatter

ROOT = Path(__file__).resolve().parent.parent


def _record(message: str = "deployment.failed", *, exc_info=None, **extra) -> logging.LogRecord:
    logger = logging.getLogger("deployments.services")
    return logger.makeRecord(logger.name, logging.WARNING, __file__, 1, message, (), exc_info, extra=extra)


def test_plain_format_writes_extra_fields_as_key_value_after_the_message():
    record = _record(deployment_id=7, error='Triton did not start\nport "8000" = busy', pid=None)
    line = KeyValueFormatter().format(record)
    assert line.endswith(
        " WARNING deployments.services deployment.failed deployment_id=7 "
        'error="Triton did not start\\nport \\"8000\\" = busy" pid=None'
    )
    assert "\n" not in line


def test_plain_format_without_extra_fields_is_the_usual_line():
    record = _record("deployment.ready")
    assert KeyValueFormatter().format(record) == logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s"
    ).format(record)


def test_plain_format_puts_extra_fields_before_the_traceback():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = _record("build.failed", exc_info=sys.exc_info(), version_id=3)
    first, *rest = KeyValueFormatter().format(record).splitlines()
    assert first.endswith("build.failed version_id=3")
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "RuntimeError: boom"


def test_json_format_writes_one_object_per_line_with_the_extra_fields():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = _record(
            exc_info=sys.exc_info(), deployment_id=7, level="mine", ratio=float("nan"), path=Path("/tmp/x")
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    body = json.loads(line)
    assert body["level"] == "WARNING"
    assert body["logger"] == "deployments.services"
    assert body["event"] == "deployment.failed"
    assert body["time"].endswith("+00:00")
    assert body["deployment_id"] == 7
    # a field named like a key of the line does not overwrite it; what JSON cannot hold is a string
    assert body["extra_level"] == "mine"
    assert body["ratio"] == "nan"
    assert body["path"] == "/tmp/x"
    assert body["exc_info"].endswith("RuntimeError: boom")


def _log_through_settings(tmp_path: Path, log_format: str | None) -> subprocess.CompletedProcess:
    """Configure Django from conch.settings in a fresh process, log one event with fields, return its output."""
    env = {k: v for k, v in os.environ.items() if k != "CONCH_LOG_FORMAT"}
    env["CONCH_VAR_DIR"] = str(tmp_path)
    if log_format is not None:
        env["CONCH_LOG_FORMAT"] = log_format
    code = (
        "import logging, django; django.setup(); "
        "logging.getLogger('deployments.services').info('deployment.ready', extra={'deployment_id': 7, 'pid': 42})"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "conch.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_settings_log_plain_lines_with_fields_by_default(tmp_path):
    result = _log_through_settings(tmp_path, None)
    assert result.returncode == 0, result.stderr
    assert result.stderr.rstrip("\n").endswith(" INFO deployments.services deployment.ready deployment_id=7 pid=42")


def test_settings_log_json_lines_when_asked(tmp_path):
    result = _log_through_settings(tmp_path, "json")
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.splitlines()
    body = json.loads(line)
    assert {k: body[k] for k in ("level", "logger", "event", "deployment_id", "pid")} == {
        "level": "INFO",
        "logger": "deployments.services",
        "event": "deployment.ready",
        "deployment_id": 7,
        "pid": 42,
    }


@pytest.mark.parametrize("value", ["JSON", "xml", ""])
def test_settings_refuse_an_unknown_log_format(tmp_path, value):
    result = _log_through_settings(tmp_path, value)
    assert result.returncode != 0
    assert "CONCH_LOG_FORMAT" in result.stderr and "ImproperlyConfigured" in result.stderr
