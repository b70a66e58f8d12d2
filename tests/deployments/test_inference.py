"""Inference through Conch's `/infer` on real local Tritons: non-finite outputs, binary tensor data, tensor errors,
and the gateway's rate limit and usage meter on the same path.

Tasks run inline (eager Celery, on commit); each deployment is a real tritonserver process. Requests are built with
tritonclient's own helpers where the binary protocol is involved, and outputs are compared with onnxruntime's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import tritonclient.http as triton_http
from django.test import Client
from onnx import TensorProto, helper

from deployments.models import GatewayUsage
from tenancy.models import ApiToken
from tests import real_models
from tests.deployments.conftest import write_built_version
from tests.flows import deploy_ready

pytestmark = pytest.mark.django_db

HEADER_LENGTH = "Inference-Header-Content-Length"


def _log_model(path: Path) -> Path:
    """y = Log(x + shift): x FP32 [batch, 4], shift FP32 [batch, 1] -> y FP32 [batch, 4].

    0 gives -inf and a negative number NaN, so outputs hold non-finite floats; two inputs let a request miss one.
    """
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "shift"], ["shifted"]), helper.make_node("Log", ["shifted"], ["y"])],
        "log_of_shifted",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("shift", TensorProto.FLOAT, ["batch", 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def _onnxruntime(model: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)


def _post_binary(caller, url: str, inputs, outputs):
    """POST a request body built by tritonclient's own binary-protocol helper."""
    body, json_size = triton_http.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    headers = {} if json_size is None else {f"HTTP_{HEADER_LENGTH.upper().replace('-', '_')}": str(json_size)}
    return caller.client.generic("POST", url, body, content_type="application/octet-stream", **headers)


@pytest.mark.triton
def test_outputs_holding_inf_and_nan_come_back_as_triton_writes_them(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given a deployed model computing log(x + shift)
    model = _log_model(tmp_path / "log.onnx")
    version = write_built_version(alice.team, "logarithm", model)
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, version.pk)
    url = f"/api/v1/deployments/{deployment['id']}/infer"
    x = np.array([[0.0, -1.0, 1.0, 2.0]], dtype=np.float32)
    shift = np.zeros((1, 1), dtype=np.float32)
    [expected] = _onnxruntime(model, {"x": x, "shift": shift})
    assert np.isneginf(expected[0, 0]) and np.isnan(expected[0, 1])
    request = {
        "inputs": [
            {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x.ravel().tolist()},
            {"name": "shift", "shape": [1, 1], "datatype": "FP32", "data": [0.0]},
        ]
    }

    # when the outputs hold -inf and NaN
    response = alice.client.post(url, request, format="json")

    # then the answer is Triton's own 200 JSON, with the non-finite values written as Triton writes them
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    assert b'"data":[-Infinity,NaN,0.0,' in response.content
    [output] = json.loads(response.content)["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("y", "FP32", [1, 4])
    np.testing.assert_array_equal(np.array(output["data"], dtype=np.float32).reshape(1, 4), expected)

    # when the same tensors go as binary data, with binary outputs asked for
    inputs = [triton_http.InferInput("x", [1, 4], "FP32"), triton_http.InferInput("shift", [1, 1], "FP32")]
    inputs[0].set_data_from_numpy(x, binary_data=True)
    inputs[1].set_data_from_numpy(shift, binary_data=True)
    response = _post_binary(alice, url, inputs, [triton_http.InferRequestedOutput("y", binary_data=True)])

    # then the raw output bytes hold the same -inf and NaN
    assert response.status_code == 200, response.content
    result = triton_http.InferenceServerClient.parse_response_body(
        response.content, header_length=int(response[HEADER_LENGTH])
    )
    np.testing.assert_array_equal(result.as_numpy("y"), expected)


@pytest.mark.triton
def test_binary_tensor_data_built_by_tritonclient_equals_onnxruntime(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # given the demo classifier deployed, and two images
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, built_classifier.pk)
    url = f"/api/v1/deployments/{deployment['id']}/infer"
    x = np.random.default_rng(3).standard_normal((2, 3, 224, 224), dtype=np.float32)
    [expected] = _onnxruntime(real_models.classifier(), {"x": x})
    image = triton_http.InferInput("x", list(x.shape), "FP32")
    image.set_data_from_numpy(x, binary_data=True)

    # when tritonclient's binary request goes through Conch, asking for a binary output
    response = _post_binary(alice, url, [image], [triton_http.InferRequestedOutput("fetch_name_0", binary_data=True)])

    # then Triton's binary answer comes back with its header length, equal to onnxruntime's outputs
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/octet-stream"
    header_length = int(response[HEADER_LENGTH])
    header = json.loads(response.content[:header_length])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 2 * 4 * 4}
    result = triton_http.InferenceServerClient.parse_response_body(response.content, header_length=header_length)
    np.testing.assert_allclose(result.as_numpy("fetch_name_0"), expected, rtol=1e-4, atol=1e-5)

    # when binary inputs ask for JSON outputs (tritonclient's default for a requested output without binary_data)
    response = _post_binary(alice, url, [image], [triton_http.InferRequestedOutput("fetch_name_0", binary_data=False)])

    # then the answer is JSON, with the same values
    assert response.status_code == 200, response.content
    assert HEADER_LENGTH not in response
    [output] = json.loads(response.content)["outputs"]
    np.testing.assert_allclose(np.array(output["data"]).reshape(2, 4), expected, rtol=1e-4, atol=1e-5)

    # when the header length does not frame the body, or bytes follow the declared tensors
    body, json_size = triton_http.InferenceServerClient.generate_request_body([image])
    for sent, header in ((body, json_size + 3), (body, json_size - 1), (body + b"\0" * 4, json_size)):
        response = alice.client.generic(
            "POST", url, sent, content_type="application/octet-stream", HTTP_INFERENCE_HEADER_CONTENT_LENGTH=str(header)
        )
        # then a 400 names the header, before anything reaches Triton
        assert response.status_code == 400
        assert response.json()["field"] == HEADER_LENGTH


def _tensor(name: str, shape: list[int], datatype: str = "FP32") -> dict:
    return {"name": name, "shape": shape, "datatype": datatype, "data": [1] * math.prod(shape)}


@pytest.mark.triton
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_triton_errors_about_a_tensor_name_it_in_field(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path, binary
):
    # given a deployed model with inputs x [batch, 4] and shift [batch, 1]
    version = write_built_version(alice.team, "logarithm", _log_model(tmp_path / "log.onnx"))
    url = f"/api/v1/deployments/{deploy_ready(alice, django_capture_on_commit_callbacks, version.pk)['id']}/infer"
    cases = [
        # (what is wrong, the inputs sent, the tensor named, words of Triton's message)
        ("wrong datatype", [_tensor("x", [1, 4], "INT32"), _tensor("shift", [1, 1])], "x", "data-type is 'INT32'"),
        ("wrong shape", [_tensor("x", [1, 5]), _tensor("shift", [1, 1])], "x", "unexpected shape for input 'x'"),
        ("unknown input", [_tensor("x", [1, 4]), _tensor("shfit", [1, 1])], "shfit", "unexpected inference input"),
        ("missing input", [_tensor("x", [1, 4])], "shift", "missing required input(s) ['shift']"),
        (
            "an input too many",
            [_tensor("x", [1, 4]), _tensor("shift", [1, 1]), _tensor("scale", [1, 1])],
            "scale",
            "expected 2 inputs but got 3",
        ),
    ]
    for problem, tensors, field, words in cases:
        # when
        if binary:
            inputs = []
            for tensor in tensors:
                dtype = np.int32 if tensor["datatype"] == "INT32" else np.float32
                inputs.append(triton_http.InferInput(tensor["name"], tensor["shape"], tensor["datatype"]))
                inputs[-1].set_data_from_numpy(np.ones(tensor["shape"], dtype=dtype), binary_data=True)
            response = _post_binary(alice, url, inputs, None)
        else:
            response = alice.client.post(url, {"inputs": tensors}, format="json")
        # then
        assert response.status_code == 400, (problem, response.content)
        body = response.json()
        assert body["field"] == field, (problem, body)
        assert words in body["detail"], (problem, body)
        # and a request whose input names are not the model's is told which inputs the model has
        if problem in ("unknown input", "missing input", "an input too many"):
            assert body["detail"].endswith("The model's inputs: x FP32 [-1, 4]; shift FP32 [-1, 1]."), body
        else:
            assert "The model's inputs" not in body["detail"], body


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded", "text/plain"])
def test_browser_session_with_csrf_token_reaches_the_deployment_whatever_the_content_type(
    alice, built_classifier, content_type
):
    # given a logged-in browser session (Swagger UI's "Try it out" after logging in to the console)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice.user)
    browser.cookies["csrftoken"] = "c" * 32
    created = alice.client.post(
        "/api/v1/deployments/", {"name": "web", "team": "acme", "model_version": built_classifier.pk}, format="json"
    )
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
    # when it sends an inference request with its CSRF token (the session check reads the body as a form)
    response = browser.generic(
        "POST",
        f"/api/v1/deployments/{created.json()['id']}/infer",
        body,
        content_type=content_type,
        HTTP_X_CSRFTOKEN="c" * 32,
    )
    # then the request gets past authentication to the deployment, which is not started
    assert response.status_code == 409, response.content
    assert response.json()["detail"].endswith("not ready.")


def test_a_body_over_the_size_limit_gets_413(alice, built_classifier, settings):
    # given a small limit (CONCH_MAX_REQUEST_BODY_BYTES)
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    created = alice.client.post(
        "/api/v1/deployments/", {"name": "web", "team": "acme", "model_version": built_classifier.pk}, format="json"
    )
    # when
    response = alice.client.generic(
        "POST", f"/api/v1/deployments/{created.json()['id']}/infer", b"0" * 5000, content_type="application/json"
    )
    # then
    assert response.status_code == 413, response.content
    assert "CONCH_MAX_REQUEST_BODY_BYTES" in response.json()["detail"]


@pytest.mark.parametrize("header", ["abc", "-1", "", "²", "1.5"])
def test_a_header_length_that_is_no_byte_count_gets_400_naming_it(alice, built_classifier, header):
    created = alice.client.post(
        "/api/v1/deployments/", {"name": "web", "team": "acme", "model_version": built_classifier.pk}, format="json"
    )
    response = alice.client.generic(
        "POST",
        f"/api/v1/deployments/{created.json()['id']}/infer",
        b"{}",
        content_type="application/octet-stream",
        HTTP_INFERENCE_HEADER_CONTENT_LENGTH=header,
    )
    assert response.status_code == 400, response.content
    assert response.json()["field"] == HEADER_LENGTH


@pytest.mark.triton
def test_a_tokens_inference_through_the_api_is_limited_and_metered_as_through_the_gateway(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks, inference_edge
):
    # given the demo classifier deployed (a batching model) and alice's token limited to 3 requests a minute
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, built_classifier.pk)
    url = f"/api/v1/deployments/{deployment['id']}/infer"
    token = ApiToken.objects.get(prefix=alice.token[:12])
    ApiToken.objects.filter(pk=token.pk).update(requests_per_minute=3)
    x = np.zeros((2, 3, 224, 224), dtype=np.float32)
    image = triton_http.InferInput("x", list(x.shape), "FP32")
    image.set_data_from_numpy(x, binary_data=True)
    wrong = {"inputs": [{"name": "y", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}

    # when: a batch of 2 answered, a request Triton refuses, one past the limit, and one a minute later
    answered = _post_binary(alice, url, [image], None)
    refused = alice.client.post(url, wrong, format="json")
    third = alice.client.post(url, wrong, format="json")
    limited = alice.client.post(url, wrong, format="json")
    inference_edge.clock.now += 60
    next_minute = alice.client.post(url, wrong, format="json")
    inference_edge.serving.usage.flush_blocking()

    # then the limit is the token's gateway limit, and the usage row is the one the gateway writes
    assert [r.status_code for r in (answered, refused, third, limited, next_minute)] == [200, 400, 400, 429, 400]
    assert limited.json()["detail"].startswith(f"Rate limit of 3 requests/minute for token {alice.token[:12]}…")
    [row] = GatewayUsage.objects.filter(token=token)
    assert (row.deployment_id, row.team_id) == (deployment["id"], alice.team.pk)
    assert (row.requests, row.inferences, row.errors) == (5, 2, 4)
    assert row.bytes_out == len(answered.content)
    assert row.bytes_in >= 2 * 3 * 224 * 224 * 4


@pytest.mark.triton
def test_a_console_session_infers_through_the_same_path_unmetered(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks, inference_edge
):
    # given a deployment and a signed-in console user (no token)
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, built_classifier.pk)
    browser = Client()
    browser.force_login(alice.user)
    request = {"inputs": [{"name": "x", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": [0.0] * 150528}]}

    # when
    response = browser.post(
        f"/api/v1/deployments/{deployment['id']}/infer", json.dumps(request), content_type="application/json"
    )
    inference_edge.serving.usage.flush_blocking()

    # then it is answered through the relay, and nothing is metered (usage is kept per token)
    assert response.status_code == 200, response.content
    assert json.loads(response.content)["outputs"][0]["shape"] == [1, 4]
    assert not GatewayUsage.objects.exists()
