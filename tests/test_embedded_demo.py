"""The embedded default path, as `make demo` runs it: SQLite, filesystem broker, folder storage.

Runs `manage.py run_demo --no-wait` in a fresh var folder with none of the production
variables set: it starts gunicorn, a Celery worker and beat as processes, and drives
upload -> build -> deploy -> infer through the REST API over HTTP.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from django.conf import settings

pytestmark = pytest.mark.e2e


def test_demo_runs_on_the_embedded_defaults(tmp_path):
    # given a clean environment: no DATABASE_URL, broker or storage variables
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DATABASE_URL", "CELERY_", "CONCH_", "DJANGO_"))}
    instance = f"conchdemotest{os.getpid()}"
    env.update({"CONCH_VAR_DIR": str(tmp_path / "var"), "CONCH_INSTANCE_ID": instance,
                "CONCH_RECONCILE_INTERVAL_SECONDS": "5"})
    # when
    result = subprocess.run(
        [sys.executable, "manage.py", "run_demo", "--no-wait", "--port", "0", "--timeout", "300"],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=900,
    )
    # then
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines() if line.startswith("CONCH_"))
    assert lines["CONCH_URL"].startswith("http://127.0.0.1:")
    assert lines["CONCH_TOKEN"].startswith("conch_")
    assert int(lines["CONCH_DEPLOYMENT"]) >= 1
    assert "inference: scores" in result.stdout
    var = tmp_path / "var"
    database = sqlite3.connect(var / "conch.sqlite3")
    assert database.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert database.execute("SELECT status FROM models_registry_modelversion").fetchall() == [("built",)]
    assert (var / "broker" / "queue").is_dir()
    assert any((var / "storage").rglob("config.pbtxt"))
    # and Ctrl-C-equivalent shutdown left no Triton behind
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if any(instance in a for a in (p.info["cmdline"] or []))]
    assert leftovers == []
    assert "stopped web, worker, beat and 1 Triton process(es)" in result.stdout
