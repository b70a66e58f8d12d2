"""The inference gateway with KServe's own REST client (`kserve.InferenceRESTClient`, protocol v2), unchanged,
against a live Conch and a real Triton: `/serve/<team>/<deployment>` with a bearer token.

kserve cannot share Conch's .venv (it requires psutil<6; Conch pins 7.2.2), so the client runs in `.venv-kserve`
(`make venv`, requirements-kserve.txt) through `kserve_client_script.py`, which takes the calls as JSON and prints
what the client returned or raised. KServe's REST client has no model metadata or configuration call (only
`infer`, `explain`, `is_server_live`, `is_server_ready`, `is_model_ready`); test_gateway.py covers those with
tritonclient.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from deployments.choices import DeploymentStatus
from deployments.models import Deployment
from tenancy.models import ApiToken
from tenancy.services import create_api_token
from tests.deployments import test_gateway

pytestmark = pytest.mark.e2e

#: test_gateway's fixture (a ready `adder` deployment, y = x + 1; a token; the gateway's base URL), shared so that a
#: change to how the gateway is served reaches these tests too.
served = test_gateway.served

ROOT = Path(__file__).resolve().parents[2]
KSERVE_PYTHON = ROOT / ".venv-kserve" / "bin" / "python"
SCRIPT = Path(__file__).with_name("kserve_client_script.py")

X = [[0.0, 0.25, 0.5, 0.75], [1.0, 1.25, 1.5, 1.75]]
Y = [[1.0, 1.25, 1.5, 1.75], [2.0, 2.25, 2.5, 2.75]]


def run_kserve_client(base: str, calls: list[dict]) -> list[dict]:
    """Run `calls` with KServe's client in .venv-kserve against `base`; one result per call."""
    if not KSERVE_PYTHON.exists():
        pytest.fail(f"{KSERVE_PYTHON} is missing: `make venv` builds it from requirements-kserve.txt")
    done = subprocess.run(
        [str(KSERVE_PYTHON), str(SCRIPT), base],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def infer_call(token: str | None, model: str, data: list, *, binary: bool = False) -> dict:
    """A call of `infer` with FP32 input `x` = `data`, asking for output `y`, in JSON or binary tensor data."""
    return {"call": "infer", "token": token, "model": model, "input": {"name": "x", "data": data}, "output": "y",
            "binary": binary}  # fmt: skip


def test_kserve_client_checks_health_and_infers_with_json_and_binary_data(served):
    caller, deployment, base = served
    token = caller.token
    results = run_kserve_client(
        base,
        [
            {"call": "is_server_live", "token": token},
            {"call": "is_server_ready", "token": token},
            {"call": "is_model_ready", "token": token, "model": "adder"},
            infer_call(token, "adder", X),
            infer_call(token, "adder", X, binary=True),
        ],
    )
    assert results[:3] == [{"value": True}, {"value": True}, {"value": True}]
    assert results[3] == {"value": {"outputs": {"y": Y}, "sent_header_length": None, "answer_header_length": None}}
    binary = results[4]["value"]
    assert binary["outputs"] == {"y": Y}
    # binary both ways: the request and the answer each a JSON header with the 8 FP32 values (32 bytes) after it,
    # which the client splits at Inference-Header-Content-Length (the gateway passes it on both ways)
    assert None not in (binary["sent_header_length"], binary["answer_header_length"])


def test_kserve_client_shows_conchs_errors(served):
    caller, deployment, base = served
    expired = create_api_token(user=caller.user, team=caller.team, name="old", scopes=["infer"])
    ApiToken.objects.filter(pk=expired.token.pk).update(expires_at=datetime(2026, 3, 1, 12, tzinfo=UTC))
    read_only = create_api_token(user=caller.user, team=caller.team, name="read", scopes=["read"])

    results = run_kserve_client(
        base,
        [
            {"call": "is_server_ready", "token": None},
            {"call": "is_server_ready", "token": expired.secret},
            {"call": "is_server_live", "token": read_only.secret},
            {"call": "is_model_ready", "token": caller.token, "model": "classifier"},
            infer_call(caller.token, "classifier", X),
            infer_call(caller.token, "adder", [[1.0, 2.0, 3.0]]),
        ],
    )

    no_token, expired_answer, no_scope, other_ready, other_infer, wrong_shape = results
    assert no_token == {
        "status": 401,
        "error": "Send a Conch API token with the infer scope as 'Authorization: Bearer conch_…' "
        f"(POST /api/v1/tokens/)., '401 Unauthorized' for url '{base}/v2/health/ready'",
    }
    assert expired_answer == {
        "status": 401,
        "error": f"token {expired.token.prefix}… expired on 2026-03-01; create a new one, "
        f"'401 Unauthorized' for url '{base}/v2/health/ready'",
    }
    assert no_scope == {
        "status": 403,
        "error": f"Using the inference gateway needs a token with the 'infer' scope; token {read_only.token.prefix}… "
        f"has read. Create a token with that scope., '403 Forbidden' for url '{base}/v2/health/live'",
    }
    # KServe's v2 is_model_ready reads any non-2xx answer as "not ready" and raises nothing
    assert other_ready == {"value": False}
    assert other_infer == {
        "status": 404,
        "error": "Model 'classifier' is not served here; deployment 'adder' serves 'adder'., "
        f"'404 Not Found' for url '{base}/v2/models/classifier/infer'",
    }
    # Triton's own refusal, passed back as Triton wrote it, reaches the client's message
    assert wrong_shape["status"] == 400
    assert "unexpected shape for input 'x' for model 'adder'. Expected [-1,4], got [1,3]." in wrong_shape["error"]
    assert wrong_shape["error"].endswith(f", '400 Bad Request' for url '{base}/v2/models/adder/infer'")


def test_kserve_client_sees_a_deployment_that_is_not_serving(served):
    caller, deployment, base = served
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.STARTING)  # e.g. its Triton restarting

    live, ready, model_ready, infer = run_kserve_client(
        base,
        [
            {"call": "is_server_live", "token": caller.token},
            {"call": "is_server_ready", "token": caller.token},
            {"call": "is_model_ready", "token": caller.token, "model": "adder"},
            infer_call(caller.token, "adder", X),
        ],
    )

    assert live == {"value": True}
    assert model_ready == {"value": False}  # v2: any answer but 2xx is "not ready"
    assert infer == {
        "status": 503,
        "error": "Deployment 'adder' is starting, not serving; retry when it is ready., "
        f"'503 Service Unavailable' for url '{base}/v2/models/adder/infer'",
    }
    # KServe's client raises on any answer to v2/health/ready but 2xx and shows the body's "error".
    assert ready["status"] == 503
    assert ready["error"] == (
        "Deployment 'adder' is starting, not serving; retry when it is ready., "
        f"'503 Service Unavailable' for url '{base}/v2/health/ready'"
    )
