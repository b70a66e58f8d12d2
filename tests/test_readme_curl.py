"""The "With curl only" block of docs/api.md (linked from the README), run as written (bash, curl, python3) against
a live Conch: register, upload magika, wait for its build, deploy it on a local Triton, write /tmp/request.json and
infer, read metrics, stop."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import make_caller

pytestmark = pytest.mark.e2e

API_DOC = Path(settings.BASE_DIR) / "docs" / "api.md"


def curl_block() -> str:
    """The first ```sh block after the heading "## With curl only" of docs/api.md."""
    text = API_DOC.read_text()
    section = text[text.index("## With curl only") :]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found, "no sh block under 'With curl only'"
    return found.group(1)


def json_objects(text: str) -> list[dict]:
    """Every JSON object printed in `text` (curl prints answers without a newline, one after another)."""
    decoder, found, at = json.JSONDecoder(), [], text.find("{")
    while at != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1)
            continue
        found.append(value)
        at = text.find("{", end)
    return found


def test_the_readme_curl_steps_work_as_written(live_server, transactional_db, eager_tasks, tmp_path):
    # given a developer of team `demo` (the block's team) and CONCH_URL/CONCH_TOKEN as `. var/demo.env` sets them
    caller = make_caller("alice", "demo")
    # (its /tmp/request.json goes to this test's own folder, so a file left by an earlier run proves nothing)
    steps = curl_block().replace("/tmp/request.json", str(tmp_path / "request.json"))
    (tmp_path / "steps.sh").write_text("set -euo pipefail\n" + steps)
    env = {**os.environ, "CONCH_URL": live_server.url, "CONCH_TOKEN": caller.token}
    # when the block runs from the repository root
    done = subprocess.run(
        ["bash", str(tmp_path / "steps.sh")],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    try:
        # then every step worked, the inference answered with magika's output, and the deployment is stopping
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        answers = json_objects(done.stdout)
        inferred = [a for a in answers if "outputs" in a and all("data" in o for o in a["outputs"])]
        assert len(inferred) == 1, done.stdout[-3000:]
        (output,) = inferred[0]["outputs"]
        assert (output["name"], output["shape"]) == ("target_label", [1, 214]), output
    finally:
        deployments = caller.client.get("/api/v1/deployments/").json()["results"]
        deadline = time.monotonic() + 120
        for deployment in deployments:
            if deployment["status"] != "stopped":
                caller.client.delete(f"/api/v1/deployments/{deployment['id']}/")
            while caller.client.get(f"/api/v1/deployments/{deployment['id']}/").json()["status"] != "stopped":
                assert time.monotonic() < deadline, "the deployment did not stop"
                time.sleep(1)
