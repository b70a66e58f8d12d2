"""Every Triton Conch starts is locked down (Triton "Limit Endpoint Access"): tests against a real server.

The repository (load/unload/index), model-config, statistics, shared-memory, trace and logging endpoints refuse
requests without the server's key, over HTTP and gRPC; health, metadata and inference stay open.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from conch.errors import InvalidInput
from tests.real_models import classifier
from tritonserving.access import (
    API_KEY_HEADER,
    GRPC_API_KEY_HEADER,
    derive_api_key,
    restricted_api_flags,
)
from tritonserving.client import TritonAccessDenied, TritonClient
from tritonserving.server import (
    allocate_ports,
    ensure_backend_directory,
    find_servers,
    start_server,
    stop_server,
    wait_until_ready,
)

SECRET = "test-django-secret-key"
REFUSED = "This API is restricted, expecting header 'X-Conch-Key'"


def _write_classifier(repository: Path, name: str) -> None:
    config = model_config_pb2.ModelConfig(name=name, backend="onnxruntime", max_batch_size=4)
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[3, 224, 224])
    config.output.add(name="fetch_name_0", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    config.instance_group.add(count=1, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    (repository / name / "1").mkdir(parents=True)
    shutil.copyfile(classifier(), repository / name / "1" / "model.onnx")
    (repository / name / "config.pbtxt").write_text(text_format.MessageToString(config))


# The module's tests share one tritonserver (started by the first that needs it, before the check of
# tests/conftest.py looks): all are marked, so `make test-fast` leaves the module out.
pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server with models `orientation` and `spare` in its repository, started as Conch starts servers."""
    base = tmp_path_factory.mktemp("locked")
    repository = base / "repository"
    for name in ("orientation", "spare"):
        _write_classifier(repository, name)
    server_id = f"conchtest-access-{uuid.uuid4().hex[:8]}"
    http_port, grpc_port, metrics_port = allocate_ports(3)
    process = start_server(
        server_id=server_id,
        repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_path=base / "triton.log",
        backend_root=ensure_backend_directory(base / "backends"),
        api_key=derive_api_key(SECRET, server_id),
    )
    try:
        wait_until_ready(process, timeout_s=60)
        yield process
    finally:
        stop_server(process.pid, process.create_time, timeout_s=10)


@pytest.fixture(scope="module")
def key(server) -> str:
    return derive_api_key(SECRET, server.server_id)


def _http(server, method: str, path: str, *, key: str | None = None, body: dict | None = None) -> tuple[int, str]:
    headers = {API_KEY_HEADER: key} if key is not None else {}
    data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
    request = urllib.request.Request(f"{server.http_url}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _image_request(image: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(image.shape), "datatype": "FP32", "data": image.ravel().tolist()}]}


def test_derived_keys_are_stable_and_differ_per_server_and_secret():
    key = derive_api_key(SECRET, "conch.dep.1")

    assert key == derive_api_key(SECRET.encode(), "conch.dep.1")
    assert len(key) == 64 and set(key) <= set("0123456789abcdef")
    assert key != derive_api_key(SECRET, "conch.dep.2")
    assert key != derive_api_key(SECRET + "x", "conch.dep.1")


@pytest.mark.parametrize(
    ("secret", "server_id", "field"),
    [("", "conch.dep.1", "secret"), (SECRET, "", "server_id")],
)
def test_a_key_needs_a_secret_and_a_server_id(secret, server_id, field):
    with pytest.raises(InvalidInput) as raised:
        derive_api_key(secret, server_id)

    assert raised.value.field == field


@pytest.mark.parametrize("bad", ["", "short", "has:colon-0123456789", "has=equals-0123456789", "a b c d e f g h i"])
def test_a_key_that_would_break_tritons_flag_is_refused_without_echoing_it(bad):
    with pytest.raises(InvalidInput) as raised:
        restricted_api_flags(bad)

    assert raised.value.field == "api_key"
    assert raised.value.detail.startswith("the Triton API key must be 16-256 letters")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/spare/load"),
        ("POST", "/v2/repository/models/spare/unload"),
        ("GET", "/v2/models/orientation/config"),
        ("GET", "/v2/models/orientation/stats"),
        ("GET", "/v2/systemsharedmemory/status"),
        ("GET", "/v2/trace/setting"),
        ("GET", "/v2/logging"),
    ],
)
def test_restricted_http_endpoints_refuse_requests_without_the_key_or_with_another(server, key, method, path):
    # when
    without = _http(server, method, path)
    wrong = _http(server, method, path, key=derive_api_key(SECRET, "another-server"))

    # then
    assert without == (403, json.dumps({"error": REFUSED}, separators=(",", ":")))
    assert wrong[0] == 403


def test_the_key_opens_the_repository_api_and_inference_stays_open(server, key):
    # when: Conch's own client (with the key) loads a model; a caller without the key infers
    with TritonClient(server.http_url, timeout_s=60, api_key=key) as conch:
        conch.load_model("orientation")
        index = {entry["name"]: entry.get("state") for entry in conch.repository_index()}
        config = conch.model_config("orientation")
    image = np.random.default_rng(5).random((1, 3, 224, 224), dtype=np.float32)
    status, body = _http(server, "POST", "/v2/models/orientation/infer", body=_image_request(image))

    # then
    assert index == {"orientation": "READY", "spare": None}
    assert config["max_batch_size"] == 4
    assert status == 200
    [output] = json.loads(body)["outputs"]
    expected = ort.InferenceSession(str(classifier())).run(["fetch_name_0"], {"x": image})[0]
    assert np.allclose(np.array(output["data"], dtype=np.float32).reshape(1, 4), expected, atol=1e-4)
    assert _http(server, "GET", "/v2/health/ready")[0] == 200
    assert _http(server, "GET", "/v2/models/orientation/ready")[0] == 200
    assert _http(server, "GET", "/v2/models/orientation")[0] == 200  # metadata: what a client needs to call it
    assert _http(server, "GET", "/v2/models/orientation/config", key=key)[0] == 200
    assert _http(server, "POST", "/v2/repository/models/spare/load", key=key)[0] == 200
    assert _http(server, "POST", "/v2/repository/models/spare/unload", key=key)[0] == 200


def test_a_client_without_the_key_cannot_load_unload_or_read_the_config(server, key):
    # given
    keyless = TritonClient(server.http_url, timeout_s=30)
    wrong = TritonClient(server.http_url, timeout_s=30, api_key=derive_api_key(SECRET, "another-server"))

    # when / then
    with pytest.raises(TritonAccessDenied) as no_key:
        keyless.load_model("spare")
    with pytest.raises(TritonAccessDenied) as wrong_key:
        wrong.unload_model("orientation")
    with pytest.raises(TritonAccessDenied):
        keyless.model_config("orientation")
    assert "Conch sent no API key" in no_key.value.detail
    assert "the key Conch sent is not this server's" in wrong_key.value.detail
    assert REFUSED in no_key.value.detail
    with TritonClient(server.http_url, timeout_s=30, api_key=key) as conch:
        assert conch.model_ready("spare") is False
        assert keyless.model_ready("orientation") is True  # readiness is open: reconcile may ask without a key


def test_restricted_grpc_protocols_need_the_key_and_grpc_inference_stays_open(server, key):
    # given
    client = triton_grpc.InferenceServerClient(server.grpc_target)
    with TritonClient(server.http_url, timeout_s=60, api_key=key) as conch:
        conch.load_model("orientation")
    image = np.random.default_rng(9).random((1, 3, 224, 224), dtype=np.float32)
    tensor = triton_grpc.InferInput("x", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)

    try:
        # when / then: no key, or the HTTP header name, is refused
        for headers in (None, {API_KEY_HEADER.lower(): key}):
            with pytest.raises(InferenceServerException) as refused:
                client.load_model("spare", headers=headers)
            assert f"expecting header '{GRPC_API_KEY_HEADER}'" in refused.value.message()
        with pytest.raises(InferenceServerException):
            client.get_model_config("orientation")
        served = client.infer("orientation", [tensor]).as_numpy("fetch_name_0")
        statistics = client.get_inference_statistics("orientation", headers={GRPC_API_KEY_HEADER: key})
    finally:
        client.close()

    expected = ort.InferenceSession(str(classifier())).run(["fetch_name_0"], {"x": image})[0]
    assert np.allclose(served, expected, atol=1e-4)
    assert statistics.model_stats[0].name == "orientation"


def test_a_found_server_carries_its_key_so_a_restarted_conch_can_use_it(server, key):
    [found] = find_servers(server.server_id)

    assert found.api_key == key
    assert key not in repr(found)
