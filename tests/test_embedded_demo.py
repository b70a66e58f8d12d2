"""The embedded default path, as `make demo` runs it: SQLite, filesystem broker, folder storage.

Runs `manage.py run_demo` in a fresh var folder with none of the production variables set:
it starts gunicorn, a Celery worker and beat as processes and drives upload -> build ->
deploy -> infer through the REST API over HTTP. Then a CI pipeline drives a second model
with curl only (examples/ci_pipeline.sh), and Ctrl-C must stop everything, Triton included.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest
from django.conf import settings

from tests import real_models

pytestmark = pytest.mark.e2e


def _read_until(process: subprocess.Popen, marker: str, timeout: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        lines.append(line.rstrip("\n"))
        if line.startswith(marker):
            return lines
    raise AssertionError("demo did not print " + marker + ":\n" + "\n".join(lines[-80:]))


def _leftovers(instance: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if any(instance in a for a in (p.info["cmdline"] or []))]


def test_demo_on_embedded_defaults_then_a_curl_pipeline_then_ctrl_c(tmp_path):
    # given a clean environment: no DATABASE_URL, broker or storage variables
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "CONCH_", "DJANGO_"))}
    instance = f"conchdemotest{os.getpid()}"
    env.update({"CONCH_VAR_DIR": str(tmp_path / "var"), "CONCH_INSTANCE_ID": instance, "PYTHONUNBUFFERED": "1"})
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "run_demo", "--port", "0", "--timeout", "300"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # when the demo comes up
        output = _read_until(demo, "CONCH_DEPLOYMENT=", timeout=600)
        found = dict(line.split("=", 1) for line in output if line.startswith("CONCH_"))
        # then it printed where to look, after a real inference
        assert found["CONCH_URL"].startswith("http://127.0.0.1:")
        assert found["CONCH_TOKEN"].startswith("conch_")
        assert int(found["CONCH_DEPLOYMENT"]) >= 1
        assert any(line.startswith("inference: scores") for line in output)

        # when a CI pipeline takes another real model through with curl
        request = tmp_path / "request.json"
        request.write_text(
            json.dumps({"inputs": [{"name": "bytes", "shape": [1, 2048], "datatype": "INT32", "data": [7] * 2048}]})
        )
        pipeline = subprocess.run(
            ["bash", "examples/ci_pipeline.sh", str(real_models.magika()), "filetype", "demo", str(request)],
            cwd=settings.BASE_DIR,
            env={**env, "CONCH_URL": found["CONCH_URL"], "CONCH_TOKEN": found["CONCH_TOKEN"]},
            capture_output=True,
            text=True,
            timeout=600,
        )
        # then every step worked
        assert pipeline.returncode == 0, pipeline.stdout + pipeline.stderr
        assert "inference output shape" in pipeline.stdout
        assert "deployment" in pipeline.stdout and "stopped" in pipeline.stdout
    finally:
        # when the user presses Ctrl-C
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=120)
    assert demo.returncode == 0, rest
    # then nothing is left running, Triton included
    assert "stopped web, worker, beat and 1 Triton process(es)" in rest
    assert _leftovers(instance) == []
    var = tmp_path / "var"
    database = sqlite3.connect(var / "conch.sqlite3")
    assert database.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert sorted(database.execute("SELECT status FROM models_registry_modelversion").fetchall()) == [
        ("built",),
        ("built",),
    ]
    assert (var / "broker" / "queue").is_dir()
    assert len(list((var / "storage").rglob("config.pbtxt"))) == 2
