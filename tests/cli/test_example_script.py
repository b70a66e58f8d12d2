"""examples/ci_pipeline.sh refuses missing arguments or settings with one clean usage line (no bash internals)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "ci_pipeline.sh"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("CONCH_URL", "CONCH_TOKEN")}
    return subprocess.run(["bash", str(SCRIPT), *args], env={**base, **env}, capture_output=True, text=True, timeout=30)


def test_no_arguments_prints_the_usage_line_and_exits_1():
    done = _run()
    assert done.returncode == 1
    assert done.stderr == "usage: ci_pipeline.sh MODEL.onnx NAME TEAM INPUT=FILE.npy…\n"
    assert done.stdout == ""


def test_missing_settings_are_named_and_exit_1():
    done = _run("m.onnx", "name", "team", "x=x.npy", CONCH_URL="http://127.0.0.1:9")
    assert done.returncode == 1 and done.stderr == "error: set CONCH_TOKEN\n"
