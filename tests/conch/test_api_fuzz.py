"""schemathesis (a third-party API fuzzer) against Conch's own OpenAPI schema: no request gets a 5xx.

It runs every operation of `/api/v1/schema/` through its phases (coverage, fuzzing, stateful) on a live server, as
a member of one team with a bearer token, with the `not_a_server_error` check. The team holds a model, a built
version, a ready deployment on a real Triton (inference gets fuzzed KServe requests; some reach Triton), a
pending one (for DELETE) and an open resumable upload, so about half the requests name objects that exist and
reach the code behind the 404s.

Bounded: a fixed seed and 15 examples per operation (every operation still runs every phase). For a longer hunt:
`CONCH_FUZZ_EXAMPLES=500 CONCH_FUZZ_SEED=<any> make test PYTEST_ARGS=tests/conch/test_api_fuzz.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployments import services as deployments
from deployments.services.requests import DeploymentRequest, PlacementRequest
from tests import real_models
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from uploads import services as uploads

SEED = os.environ.get("CONCH_FUZZ_SEED", "20260501")
EXAMPLES = os.environ.get("CONCH_FUZZ_EXAMPLES", "15")


def _config(*, model: int, version: int, ready: int, pending: int, team: str, upload: str) -> str:
    """schemathesis.toml: ids of existing objects, used for half of the generated path parameters."""
    return f"""
[dictionaries.models]
values = ["{model}"]
[dictionaries.versions]
values = ["{version}"]
[dictionaries.deployments]
values = ["{ready}"]
[dictionaries.pending]
values = ["{pending}"]
[dictionaries.teams]
values = ["{team}"]
[dictionaries.uploads]
values = ["{upload}"]

[parameters]
"path.model_id" = {{ dictionary = "models", probability = 0.5 }}
"path.version_id" = {{ dictionary = "versions", probability = 0.5 }}
"path.slug" = {{ dictionary = "teams", probability = 0.5 }}
"path.upload_id" = {{ dictionary = "uploads", probability = 0.5 }}

[[operations]]
include-path-regex = "^/api/v1/deployments/"
exclude-method = "DELETE"
parameters = {{ "path.id" = {{ dictionary = "deployments", probability = 0.5 }} }}

[[operations]]
include-path-regex = "^/api/v1/deployments/"
include-method = "DELETE"
parameters = {{ "path.id" = {{ dictionary = "pending", probability = 0.5 }} }}

[[operations]]
include-path-regex = "^/api/v1/models/"
parameters = {{ "path.id" = {{ dictionary = "models", probability = 0.5 }} }}

[[operations]]
include-path-regex = "^/api/v1/versions/"
parameters = {{ "path.id" = {{ dictionary = "versions", probability = 0.5 }} }}
"""


@pytest.mark.e2e
def test_schemathesis_gets_no_server_error_from_any_operation(
    live_server, transactional_db, eager_tasks, tmp_path, settings
):
    # given rate limits the fuzzer's thousands of requests a minute stay under (they are tested in test_abuse.py)
    settings.CONCH_API_RATES = dict.fromkeys(settings.CONCH_API_RATES, "1000000/minute")
    # and a team with a model, a built version, a ready deployment (real Triton) and a pending one
    caller = make_caller("fuzzer", "fuzz")
    version = write_built_version(caller.team, "fuzzed", real_models.classifier())
    ready = deployments.create_deployment(
        user=caller.user,
        request=DeploymentRequest(
            team_slug=caller.team.slug,
            name="ready",
            model_version_id=version.pk,
            instance_count=None,
            max_batch_size=None,
            max_queue_delay_microseconds=None,
            placement=PlacementRequest(runtime="local"),
        ),
    )  # started inline (eager tasks, on commit)
    ready.refresh_from_db()
    assert ready.status == "ready", ready.error
    # From here on tasks only queue: deployments the fuzzer creates are not started.
    eager_tasks.conf.task_always_eager = False
    pending = deployments.create_deployment(
        user=caller.user,
        request=DeploymentRequest(
            team_slug=caller.team.slug,
            name="pending",
            model_version_id=version.pk,
            instance_count=None,
            max_batch_size=None,
            max_queue_delay_microseconds=None,
            placement=PlacementRequest(runtime="local"),
        ),
    )
    # and an open resumable upload of the model (folder storage: its parts come through Conch)
    upload, _ = uploads.start_resumable_upload(
        user=caller.user, model=version.model, filename="next.onnx", size_bytes=6 * 1024 * 1024, sha256="d" * 64
    )
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        _config(
            model=version.model_id,
            version=version.pk,
            ready=ready.pk,
            pending=pending.pk,
            team=caller.team.slug,
            upload=str(upload.pk),
        )
    )

    # when schemathesis runs every operation of the schema; stopping deployments last, so the ready one serves
    # the fuzzed inference requests (it also learns ids from responses, so it would stop that one too), and
    # revoking tokens after that (it would revoke its own)
    stop = "DELETE /api/v1/deployments/{id}/"
    revoke = "DELETE /api/v1/tokens/{id}/"
    outputs = [
        _schemathesis(live_server.url, caller.token, config, tmp_path, "--exclude-name", stop, "--exclude-name", revoke)
    ]
    outputs.append(_schemathesis(live_server.url, caller.token, config, tmp_path, "--include-name", stop))
    outputs.append(_schemathesis(live_server.url, caller.token, config, tmp_path, "--include-name", revoke))

    # then nothing answered 5xx (the output names any request that did, with a curl line to replay it)
    for returncode, output in outputs:
        print(output)  # shown with -s, and by pytest when the test fails
        assert returncode == 0, output[-12000:]
    assert "56 selected / 58 total" in outputs[0][1]
    assert "1 selected / 58 total" in outputs[1][1] and "1 selected / 58 total" in outputs[2][1]


def _schemathesis(url: str, token: str, config: Path, workdir: Path, *selection: str) -> tuple[int, str]:
    """Run the schemathesis CLI on the live server's schema; return its exit code and output."""
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "--no-color",
        "--config-file",
        str(config),
        "run",
        f"{url}/api/v1/schema/",
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        "not_a_server_error",
        "--max-examples",
        EXAMPLES,
        "--seed",
        SEED,
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--request-timeout",
        "60",
        *selection,
    ]
    run = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=600)
    return run.returncode, run.stdout + run.stderr
