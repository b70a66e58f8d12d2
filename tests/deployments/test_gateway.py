"""The inference gateway with NVIDIA's own `tritonclient` (HTTP, sync and asyncio), unchanged, against a live Conch
and a real Triton: `/serve/<team>/<deployment>` with a bearer token."""

from __future__ import annotations

import asyncio
import gzip
import json
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from builds.model_config import BuildOptions
from deployments import services as deployments
from tenancy.services import create_api_token
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from tests.tiny_models import add_constant

pytestmark = pytest.mark.e2e

X = np.full((2, 4), 0.5, dtype=np.float32)


@pytest.fixture
def served(live_server, transactional_db, eager_tasks, tmp_path):
    """A ready local deployment `adder` (y = x + 1) of team `vision`, a token with every scope and the base URL."""
    caller = make_caller("ada", "vision")
    version = write_built_version(
        caller.team, "adder", add_constant(tmp_path / "v1.onnx", 1.0), BuildOptions(max_batch_size=4)
    )
    deployment = deployments.create_deployment(
        user=caller.user, team_slug="vision", name="adder", model_version_id=version.pk, runtime="local"
    )
    deployment.refresh_from_db()
    assert deployment.status == "ready", deployment.error
    base = f"{live_server.url}/serve/vision/adder"
    yield caller, deployment, base
    deployments.stop_deployment(deployment_id=deployment.pk)


def _client(base: str, token: str) -> tuple[triton_http.InferenceServerClient, dict]:
    return triton_http.InferenceServerClient(url=base.split("://", 1)[1]), {"Authorization": f"Bearer {token}"}


def test_tritonclient_http_health_metadata_config_and_binary_infer(served):
    caller, deployment, base = served
    client, headers = _client(base, caller.token)
    assert client.is_server_live(headers=headers)
    assert client.is_server_ready(headers=headers)
    assert client.is_model_ready("adder", headers=headers)
    assert "version" in client.get_server_metadata(headers=headers)
    assert [t["name"] for t in client.get_model_metadata("adder", headers=headers)["inputs"]] == ["x"]
    assert client.get_model_config("adder", headers=headers)["max_batch_size"] == 4
    for binary in (True, False):
        x = triton_http.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X, binary_data=binary)
        # a fresh dict per call: tritonclient adds Inference-Header-Content-Length to the one it is given
        result = client.infer(
            "adder", [x], outputs=[triton_http.InferRequestedOutput("y", binary_data=binary)], headers=dict(headers)
        )
        assert result.as_numpy("y").tolist() == (X + 1).tolist()
    # gzip both ways (Triton's "compression" for HTTP)
    x = triton_http.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    result = client.infer(
        "adder",
        [x],
        headers=dict(headers),
        request_compression_algorithm="gzip",
        response_compression_algorithm="gzip",
    )
    assert result.as_numpy("y").tolist() == (X + 1).tolist()
    client.close()


def test_tritonclient_asyncio_infers_through_the_gateway(served):
    caller, deployment, base = served

    async def run() -> list:
        client = triton_aio.InferenceServerClient(url=base.split("://", 1)[1])
        headers = {"Authorization": f"Bearer {caller.token}"}
        try:
            assert await client.is_server_ready(headers=headers)
            x = triton_aio.InferInput("x", list(X.shape), "FP32")
            x.set_data_from_numpy(X)
            results = await asyncio.gather(*(client.infer("adder", [x], headers=headers) for _ in range(8)))
            return [r.as_numpy("y").tolist() for r in results]
        finally:
            await client.close()

    assert asyncio.run(run()) == [(X + 1).tolist()] * 8


def test_errors_come_back_in_the_form_clients_read(served):
    caller, deployment, base = served
    no_token = requests.get(f"{base}/v2/health/ready", timeout=10)
    assert no_token.status_code == 401 and "Bearer" in no_token.json()["error"]
    assert no_token.headers["WWW-Authenticate"].startswith("Bearer")
    headers = {"Authorization": f"Bearer {caller.token}"}
    other_model = requests.get(f"{base}/v2/models/classifier/ready", headers=headers, timeout=10)
    assert other_model.status_code == 404 and "serves 'adder'" in other_model.json()["error"]
    unknown = requests.get(f"{base}/v2/repository/index", headers=headers, timeout=10)
    assert unknown.status_code == 404 and "error" in unknown.json()
    wrong_method = requests.get(f"{base}/v2/models/adder/infer", headers=headers, timeout=10)
    assert wrong_method.status_code == 405
    bad = requests.post(
        f"{base}/v2/models/adder/infer",
        headers=headers,
        json={"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]},
        timeout=10,
    )
    assert bad.status_code == 400 and "error" in bad.json()  # Triton's own message, passed back
    # a body Triton would answer with a 500 is refused first, as a client error naming what is wrong
    garbled = requests.post(f"{base}/v2/models/adder/infer", headers=headers, data=b'{"inputs": [', timeout=10)
    assert garbled.status_code == 400 and "error" in garbled.json()
    short = requests.post(
        f"{base}/v2/models/adder/infer",
        headers={**headers, "Inference-Header-Content-Length": "999"},
        data=b'{"inputs": []}',
        timeout=10,
    )
    assert short.status_code == 400 and "Inference-Header-Content-Length" in short.json()["error"]
    client, _ = _client(base, caller.token)
    assert client.is_server_ready() is False  # no token: tritonclient reads the 401 as not ready
    with pytest.raises(InferenceServerException, match="Bearer"):
        client.get_model_metadata("adder")  # and raises Conch's error text where it reads a body
    client.close()


def test_a_token_without_infer_scope_or_of_another_team_is_refused(served):
    caller, deployment, base = served
    read_only = create_api_token(user=caller.user, name="read", team=caller.team, scopes=["read"]).secret
    refused = requests.get(f"{base}/v2/health/ready", headers={"Authorization": f"Bearer {read_only}"}, timeout=10)
    assert refused.status_code == 403 and "infer" in refused.json()["error"]
    outsider = make_caller("eve", "other")
    hidden = requests.get(f"{base}/v2/health/ready", headers={"Authorization": f"Bearer {outsider.token}"}, timeout=10)
    assert hidden.status_code == 404 and "error" in hidden.json()


def test_the_deployment_shows_its_gateway_url(served):
    caller, deployment, base = served
    shown = caller.client.get(f"/api/v1/deployments/{deployment.pk}/").json()
    assert urlsplit(shown["endpoints"]["gateway"]).path == "/serve/vision/adder"


def test_gzip_request_body_is_passed_as_is(served):
    caller, deployment, base = served
    body = gzip.compress(
        json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}).encode()
    )
    answer = requests.post(
        f"{base}/v2/models/adder/infer",
        data=body,
        headers={"Authorization": f"Bearer {caller.token}", "Content-Encoding": "gzip"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [1.0, 1.0, 1.0, 1.0]
