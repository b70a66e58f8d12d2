"""Batching decided from the model and proven by the verify step; sample inputs; configs served as written.

Builds run inline (eager Celery) and verify on a real Triton; deployments start a real local Triton.
"""

from __future__ import annotations

import io
import threading
import tracemalloc

import numpy as np
import onnx
import onnxruntime
import psutil
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from onnx import TensorProto, helper, numpy_helper

from builds.services import current_build, current_error, current_options, run_build
from deployments.models import Deployment
from deployments.runtimes.local import LocalServerState, triton_api_key
from models_registry.models import ModelVersion
from models_registry.services import sample_inputs_key
from models_registry.storage import get_object_store
from tests import real_models
from tests.flows import deploy_ready
from tests.npz_bombs import lying_npz, npz_bomb
from tests.tiny_models import add_constant, onnx_like
from tritonserving.client import TritonClient
from tritonserving.config import config_from_pbtxt

pytestmark = [pytest.mark.django_db]


# --- helpers --------------------------------------------------------------------------------------------------


def _onnx_bytes(nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def time_major_rnn() -> bytes:
    """A time-major RNN: x [seq, batch, 2] -> y [seq, batch, 4]. Axis 0 is the sequence; the batch is axis 1."""
    rng = np.random.default_rng(7)
    weights = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in (("W", (1, 4, 2)), ("R", (1, 4, 4)), ("B", (1, 8)))
    ]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    return _onnx_bytes(
        [
            helper.make_node("RNN", ["x", "W", "R", "B"], ["Y"], hidden_size=4),
            helper.make_node("Squeeze", ["Y", "axes"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", "batch", 4])],
        [*weights, axes],
    )


def softmax_over_axis_0() -> bytes:
    """x [n, 3] -> probs [n, 3] = softmax over axis 0: the same symbol on every tensor, yet rows are mixed."""
    return _onnx_bytes(
        [helper.make_node("Softmax", ["x"], ["probs"], axis=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["n", 3])],
    )


def npz(**arrays: np.ndarray) -> SimpleUploadedFile:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return SimpleUploadedFile("samples.npz", buffer.getvalue())


def model_id(caller, name: str) -> int:
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def upload(caller, capture, name: str, data: bytes, **fields):
    with capture(execute=True):
        response = caller.client.post(
            f"/api/v1/models/{model_id(caller, name)}/versions/",
            {"file": SimpleUploadedFile("model.onnx", data), **fields},
        )
    return response


def built(caller, capture, name: str, data: bytes, **fields) -> dict:
    response = upload(caller, capture, name, data, **fields)
    assert response.status_code == 201, response.content
    return caller.client.get(f"/api/v1/versions/{response.json()['id']}/").json()


def step_log(version: dict, name: str) -> list[str]:
    return next(step["log"] for step in version["steps"] if step["name"] == name)


def onnxruntime_outputs(data: bytes, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


# --- batching decided from the model --------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_time_major_model_is_served_without_batching_and_requests_never_mix(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given a time-major RNN (axis 0 is the sequence, axis 1 the batch), uploaded with no options
    data = time_major_rnn()
    version = built(alice, django_capture_on_commit_callbacks, "rnn", data)

    # then it is built without batching, and the configure log names the tensors and their axis names
    assert version["status"] == "built", version["error"]
    config = config_from_pbtxt(version["config_pbtxt"])
    assert (config.max_batch_size, config.HasField("dynamic_batching")) == (0, False)
    assert [list(t.dims) for t in [*config.input, *config.output]] == [[-1, -1, 2], [-1, -1, 4]]
    configure = step_log(version, "configure")
    assert any(
        "batching off: Triton batches along axis 0 only, and axis 0 is not the same dynamic batch axis on every "
        "input and output: input 'x' names axis 1 'batch', so its batch axis is axis 1, not axis 0; output 'y' "
        "names axis 1 'batch', so its batch axis is axis 1, not axis 0." in line
        for line in configure
    ), configure
    assert any("input x: FP32 [-1, -1, 2] axes [seq, batch, -]" in line for line in step_log(version, "inspect"))

    # when it is deployed and two clients send different sequences at the same moment, several times
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, version["id"], "rnn")
    rng = np.random.default_rng(0)
    barrier = threading.Barrier(2)
    for _ in range(5):
        requests = [rng.standard_normal((3, 2, 2)).astype(np.float32) for _ in range(2)]
        results: list[np.ndarray | None] = [None, None]

        def send(index: int, requests=requests, results=results) -> None:
            with TritonClient(deployment["endpoints"]["http"]) as client:
                barrier.wait()
                results[index] = client.infer_numpy("rnn", {"x": requests[index]})["y"]

        threads = [threading.Thread(target=send, args=(index,)) for index in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        # then each gets exactly the outputs of its own sequence
        for x, y in zip(requests, results, strict=True):
            np.testing.assert_allclose(y, onnxruntime_outputs(data, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.e2e
def test_the_batching_proof_catches_a_softmax_over_axis_0(alice, eager_tasks, django_capture_on_commit_callbacks):
    # given a model whose axis 0 has the same name everywhere but which mixes the rows (softmax over axis 0)
    version = built(alice, django_capture_on_commit_callbacks, "mixer", softmax_over_axis_0())

    # then verify found that two samples joined do not give their own outputs, and the build serves it unbatched
    assert version["status"] == "built", version["error"]
    assert any("verify will prove it safe" in line for line in step_log(version, "configure"))
    verify = step_log(version, "verify")
    assert any("batching off: output 'probs' of sample 1 differs: at index [0, 0] it is " in line for line in verify), (
        verify
    )
    assert any("rewrote config.pbtxt with max_batch_size 0" in line for line in verify)
    config = config_from_pbtxt(version["config_pbtxt"])
    assert (config.max_batch_size, config.HasField("dynamic_batching")) == (0, False)
    assert [list(t.dims) for t in [*config.input, *config.output]] == [[-1, 3], [-1, 3]]
    stored = get_object_store().read_bytes(f"{version['repository_prefix']}/mixer/config.pbtxt").decode()
    assert stored == version["config_pbtxt"]


@pytest.mark.e2e
def test_asking_to_batch_a_model_that_mixes_rows_fails_naming_max_batch_size(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    version = built(alice, django_capture_on_commit_callbacks, "mixer", softmax_over_axis_0(), max_batch_size="4")
    assert version["status"] == "failed"
    assert version["error_field"] == "max_batch_size"
    assert version["error"].startswith(
        "max_batch_size 4 was asked for, but batching is not safe for this model: output 'probs' of sample 1 differs"
    )


@pytest.mark.e2e
def test_max_batch_size_zero_stays_zero_when_served(alice, eager_tasks, django_capture_on_commit_callbacks):
    # given the classifier (dynamic axis 0) built with max_batch_size 0
    version = built(
        alice, django_capture_on_commit_callbacks, "clf", real_models.classifier().read_bytes(), max_batch_size="0"
    )
    assert version["status"] == "built", version["error"]
    assert any("batching off: max_batch_size 0 was asked for" in line for line in step_log(version, "configure"))

    # when it is deployed
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, version["id"], "clf")

    # then Triton serves it as written: auto-complete is off and max_batch_size reads back as 0
    server_id = LocalServerState.from_state(Deployment.objects.get(pk=deployment["id"]).runtime_state).server_id
    served = TritonClient(deployment["endpoints"]["http"], api_key=triton_api_key(server_id)).model_config("clf")
    assert served["max_batch_size"] == 0
    assert [[int(d) for d in item["dims"]] for item in served["input"]] == [[-1, 3, 224, 224]]
    assert "dynamic_batching" not in served
    port = deployment["endpoints"]["http"].rsplit(":", 1)[1]
    [process] = [
        p
        for p in psutil.process_iter(["cmdline", "name"])
        if p.info["name"] == "tritonserver" and f"--http-port={port}" in (p.info["cmdline"] or [])
    ]  # (its exit watcher, its parent, carries the same arguments)
    assert "--disable-auto-complete-config" in process.info["cmdline"]
    # and a request of two images in the full shape is one run
    x = np.random.default_rng(1).random((2, 3, 224, 224), dtype=np.float32)
    body = {"inputs": [{"name": "x", "shape": [2, 3, 224, 224], "datatype": "FP32", "data": x.ravel().tolist()}]}
    response = alice.client.post(f"/api/v1/deployments/{deployment['id']}/infer", body, format="json")
    assert response.status_code == 200, response.content
    expected = onnxruntime_outputs(real_models.classifier().read_bytes(), {"x": x})[0]
    np.testing.assert_allclose(
        np.array(response.json()["outputs"][0]["data"]).reshape(2, 4), expected, rtol=1e-4, atol=1e-5
    )


def scalar_model() -> bytes:
    """gain (a scalar) * x [n] -> y [n], and total = sum(y), a scalar output."""
    return _onnx_bytes(
        [helper.make_node("Mul", ["gain", "x"], ["y"]), helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)],
        [
            helper.make_tensor_value_info("gain", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
        ],
    )


@pytest.mark.e2e
def test_scalar_inputs_and_outputs_are_served_as_dims_one(alice, eager_tasks, django_capture_on_commit_callbacks):
    # given a model with a scalar input and a scalar output
    version = built(alice, django_capture_on_commit_callbacks, "gain", scalar_model())

    # then it is built without batching, each scalar as dims [1] (Triton refuses an empty reshape unbatched)
    assert version["status"] == "built", version["error"]
    assert any(
        "input 'gain' is a scalar (rank 0) with no batch axis" in line for line in step_log(version, "configure")
    )
    config = config_from_pbtxt(version["config_pbtxt"])
    assert [(t.name, list(t.dims), t.HasField("reshape")) for t in [*config.input, *config.output]] == [
        ("gain", [1], False),
        ("x", [-1], False),
        ("y", [-1], False),
        ("total", [1], False),
    ]

    # and served: the scalar travels as [1] both ways
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, version["id"], "gain")
    body = {
        "inputs": [
            {"name": "gain", "shape": [1], "datatype": "FP32", "data": [2.0]},
            {"name": "x", "shape": [3], "datatype": "FP32", "data": [0.0, 1.0, 2.0]},
        ]
    }
    response = alice.client.post(f"/api/v1/deployments/{deployment['id']}/infer", body, format="json")
    assert response.status_code == 200, response.content
    outputs = {item["name"]: (item["shape"], item["data"]) for item in response.json()["outputs"]}
    assert outputs == {"y": ([3], [0.0, 2.0, 4.0]), "total": ([1], [6.0])}


# --- sample inputs: silero-vad --------------------------------------------------------------------------------


def silero_samples() -> dict[str, np.ndarray]:
    """One 32 ms chunk of a 440 Hz tone at 16 kHz and a zero state, in the shapes silero-vad takes."""
    t = np.arange(512, dtype=np.float32) / 16000
    return {"input": (0.5 * np.sin(2 * np.pi * 440 * t))[None, :], "state": np.zeros((2, 1, 128), np.float32)}


def infer_silero(caller, deployment: dict) -> None:
    samples = silero_samples()
    body = {
        "inputs": [
            {"name": "input", "shape": [1, 512], "datatype": "FP32", "data": samples["input"].ravel().tolist()},
            {"name": "state", "shape": [2, 1, 128], "datatype": "FP32", "data": [0.0] * 256},
            {"name": "sr", "shape": [1], "datatype": "INT64", "data": [16000]},
        ]
    }
    response = caller.client.post(f"/api/v1/deployments/{deployment['id']}/infer", body, format="json")
    assert response.status_code == 200, response.content
    outputs = {item["name"]: item for item in response.json()["outputs"]}
    expected = onnxruntime_outputs(
        real_models.silero_vad().read_bytes(), {**samples, "sr": np.array(16000, dtype=np.int64)}
    )
    assert outputs["output"]["shape"] == [1, 1]
    np.testing.assert_allclose(np.array(outputs["output"]["data"]).reshape(1, 1), expected[0], rtol=1e-4, atol=1e-5)
    assert outputs["stateN"]["shape"] == [2, 1, 128]


@pytest.mark.e2e
def test_silero_vad_with_sample_inputs_is_built_and_served(alice, eager_tasks, django_capture_on_commit_callbacks):
    # given silero-vad uploaded with its samples: arrays for input and state, and sr=16000 as a value
    version = built(
        alice,
        django_capture_on_commit_callbacks,
        "vad",
        real_models.silero_vad().read_bytes(),
        sample_inputs=npz(**silero_samples()),
        sample_values="sr=16000",
    )

    # then it is built without batching (state's axis 0 is fixed, sr is a scalar) and verified with the samples
    assert version["status"] == "built", version["error"]
    config = config_from_pbtxt(version["config_pbtxt"])
    assert config.max_batch_size == 0
    assert [(t.name, list(t.dims), t.HasField("reshape")) for t in config.input] == [
        ("input", [-1, -1], False),
        ("state", [2, -1, 128], False),
        ("sr", [1], False),
    ]
    verify = step_log(version, "verify")
    assert any("sample input sr int64 [1] (sample_values)" in line for line in verify)
    assert any("sample input input float32 [1, 512] (sample_inputs)" in line for line in verify)
    key = sample_inputs_key(model_id=version["model"], number=1)
    assert version["build_options"]["samples"] == {
        "key": key,
        "inputs": {
            "input": {"dtype": "float32", "shape": [1, 512]},
            "state": {"dtype": "float32", "shape": [2, 1, 128]},
        },
        "values": {"sr": 16000},
    }
    assert get_object_store().exists(key)
    assert not get_object_store().exists(sample_inputs_key(model_id=version["model"], number=1, incoming=True))

    # and an inference through Conch succeeds
    infer_silero(alice, deploy_ready(alice, django_capture_on_commit_callbacks, version["id"], "vad"))


@pytest.mark.e2e
def test_silero_vad_without_samples_says_what_was_sent_and_a_rebuild_adds_samples(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given silero-vad uploaded without samples
    version = built(alice, django_capture_on_commit_callbacks, "vad", real_models.silero_vad().read_bytes())

    # then verify fails, showing what was sent and how to supply samples
    assert version["status"] == "failed"
    assert version["error_field"] == "sample_inputs"
    assert "(sent: input float32 [64, 64], state float32 [2, 64, 128], sr int64 [1])" in version["error"]
    assert (
        "Conch generated these inputs because none were supplied: input float32 [64, 64] (generated: random floats "
        "in [0, 1)); state float32 [2, 64, 128] (generated: random floats in [0, 1)); sr int64 [1] (generated: all 1)"
    ) in version["error"]
    assert "-F sample_inputs=@samples.npz" in version["error"]
    assert f"POST /api/v1/versions/{version['id']}/rebuild and the same fields" in version["error"]

    # when a rebuild adds the samples
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(
            f"/api/v1/versions/{version['id']}/rebuild",
            {"sample_inputs": npz(**silero_samples()), "sample_values": "sr=16000"},
        )
    assert response.status_code == 202, response.content

    # then the version is built and serves
    version = alice.client.get(f"/api/v1/versions/{version['id']}/").json()
    assert version["status"] == "built", version["error"]
    assert version["build_options"]["samples"]["values"] == {"sr": 16000}
    infer_silero(alice, deploy_ready(alice, django_capture_on_commit_callbacks, version["id"], "vad"))


# --- sample inputs: what the API refuses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "detail"),
    [
        (
            {"sample_inputs": SimpleUploadedFile("s.npz", b"not a zip")},
            "sample_inputs",
            "The sample inputs file is not a numpy .npz archive",
        ),
        ({"sample_values": "16000"}, "sample_values", "sample_values entry '16000' is not of the form name=value"),
        ({"labels": SimpleUploadedFile("labels.txt", b"a")}, "labels", "Unexpected file field 'labels'"),
    ],
    ids=["not-npz", "bad-values", "other-file"],
)
def test_upload_refuses_bad_samples_and_keeps_nothing(
    alice, eager_tasks, django_capture_on_commit_callbacks, fields, field, detail
):
    # when a model is uploaded with bad samples
    response = upload(alice, django_capture_on_commit_callbacks, "clf", real_models.classifier().read_bytes(), **fields)

    # then 400 names the field, no version is left and nothing stays in the store
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert response.json()["detail"].startswith(detail)
    assert not ModelVersion.objects.exists()
    assert get_object_store().list_keys("") == []


def test_a_rebuild_with_a_bad_samples_file_keeps_the_versions_samples(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given a failed version with sample values (its file only starts like ONNX, so no build step runs Triton)
    png = onnx_like(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    version = built(alice, django_capture_on_commit_callbacks, "x", png, sample_values="a=1")
    assert version["status"] == "failed"
    keys = get_object_store().list_keys("")

    # when a rebuild sends a file that is not an .npz
    response = alice.client.post(
        f"/api/v1/versions/{version['id']}/rebuild", {"sample_inputs": SimpleUploadedFile("s.npz", b"nope")}
    )

    # then it is refused, and the version and the store are as they were
    assert response.status_code == 400
    assert response.json()["field"] == "sample_inputs"
    row = ModelVersion.objects.get(pk=version["id"])
    assert (row.status, current_build(row).attempt, current_options(row)["samples"]) == (
        "failed",
        1,
        {"values": {"a": 1}},
    )
    assert get_object_store().list_keys("") == keys


# --- sample inputs that unpack to too much (issue 19) ------------------------------------------------------------


def _bomb() -> SimpleUploadedFile:
    """64 MiB of float32 zeros in about 64 KB."""
    return SimpleUploadedFile("samples.npz", npz_bomb(name="x", shape=(16, 1024, 1024)))


def _traced_peak(call):
    """Run `call` under tracemalloc (numpy's buffers are traced too); return its result and the peak bytes held."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_upload_refuses_a_sample_bomb_with_413_before_unpacking_it(
    alice, eager_tasks, django_capture_on_commit_callbacks, settings, tmp_path
):
    # given a limit of 1 MiB unpacked
    settings.CONCH_MAX_SAMPLE_UNPACKED_BYTES = 1024 * 1024
    # when a model is uploaded with samples that unpack to 64 MiB
    data = add_constant(tmp_path / "add.onnx", 1.0).read_bytes()
    bomb = _bomb()
    response, peak = _traced_peak(
        lambda: upload(alice, django_capture_on_commit_callbacks, "adder", data, sample_inputs=bomb)
    )
    # then 413 names the limit and the array, nothing near 64 MiB was held, and nothing is kept
    assert peak < 16 * 1024 * 1024, peak
    assert response.status_code == 413, response.content
    assert response.json()["field"] == "sample_inputs"
    assert "'x' alone is 67,108,992" in response.json()["detail"]
    assert "at most 1,048,576 are accepted (CONCH_MAX_SAMPLE_UNPACKED_BYTES)" in response.json()["detail"]
    assert not ModelVersion.objects.exists()
    assert get_object_store().list_keys("") == []


def test_upload_refuses_the_issues_samples_with_the_default_limit(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given the file of the issue: one float32 [1000, 3, 320, 320] array (1.2 GB unpacked) under the default limit;
    # here its header declares that shape over a few bytes, so only a reader that trusts the header would allocate
    samples = lying_npz(name="images", header_shape=(1000, 3, 320, 320), data=b"\0" * 64)
    data = add_constant(tmp_path / "add.onnx", 1.0).read_bytes()
    response = upload(
        alice,
        django_capture_on_commit_callbacks,
        "adder",
        data,
        sample_inputs=SimpleUploadedFile("samples.npz", samples),
    )
    assert response.status_code == 413, response.content
    assert response.json()["detail"].startswith(
        "Array 'images' of the sample inputs file is float32 [1000, 3, 320, 320], 1,228,800,000 bytes unpacked"
    )
    assert "at most 268,435,456 are accepted (CONCH_MAX_SAMPLE_UNPACKED_BYTES)" in response.json()["detail"]


def test_upload_refuses_samples_with_too_many_arrays_with_413(
    alice, eager_tasks, django_capture_on_commit_callbacks, settings, tmp_path
):
    settings.CONCH_MAX_SAMPLE_ARRAYS = 2
    arrays = {f"a{i}": np.zeros(1, np.float32) for i in range(3)}
    data = add_constant(tmp_path / "add.onnx", 1.0).read_bytes()
    response = upload(alice, django_capture_on_commit_callbacks, "adder", data, sample_inputs=npz(**arrays))
    assert response.status_code == 413, response.content
    assert response.json() == {
        "detail": "The sample inputs file holds 3 arrays; at most 2 are accepted (CONCH_MAX_SAMPLE_ARRAYS). Send one "
        "array per model input.",
        "field": "sample_inputs",
    }
    assert not ModelVersion.objects.exists()


def test_a_rebuild_refuses_a_sample_bomb_with_413_and_keeps_the_versions_samples(
    alice, eager_tasks, django_capture_on_commit_callbacks, settings
):
    # given a failed version with sample values, and a limit of 1 MiB unpacked
    png = onnx_like(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    version = built(alice, django_capture_on_commit_callbacks, "x", png, sample_values="a=1")
    keys = get_object_store().list_keys("")
    settings.CONCH_MAX_SAMPLE_UNPACKED_BYTES = 1024 * 1024
    # when a rebuild sends samples that unpack to 64 MiB
    bomb = _bomb()
    response, peak = _traced_peak(
        lambda: alice.client.post(f"/api/v1/versions/{version['id']}/rebuild", {"sample_inputs": bomb})
    )
    # then 413 naming the limit, nothing near 64 MiB held; the version and the store are as they were
    assert peak < 16 * 1024 * 1024, peak
    assert response.status_code == 413, response.content
    assert response.json()["field"] == "sample_inputs"
    assert "(CONCH_MAX_SAMPLE_UNPACKED_BYTES)" in response.json()["detail"]
    row = ModelVersion.objects.get(pk=version["id"])
    assert (row.status, current_build(row).attempt, current_options(row)["samples"]) == (
        "failed",
        1,
        {"values": {"a": 1}},
    )
    assert get_object_store().list_keys("") == keys


def test_a_build_refuses_a_sample_bomb_that_reached_the_store_another_way(
    alice, django_capture_on_commit_callbacks, settings, tmp_path
):
    # given a version uploaded with small samples (its build not run yet)
    data = add_constant(tmp_path / "add.onnx", 1.0).read_bytes()
    response = upload(
        alice, django_capture_on_commit_callbacks, "adder", data, sample_inputs=npz(x=np.zeros((1, 4), np.float32))
    )
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(pk=response.json()["id"])
    # and its stored samples replaced by a bomb behind the web process's back, under a limit of 1 MiB
    settings.CONCH_MAX_SAMPLE_UNPACKED_BYTES = 1024 * 1024
    get_object_store().put_bytes(current_options(version)["samples"]["key"], npz_bomb(name="x", shape=(16, 1024, 1024)))
    # when the worker builds it
    outcome, peak = _traced_peak(lambda: run_build(version_id=version.pk, attempt=current_build(version).attempt))
    assert outcome == "failed"
    assert peak < 16 * 1024 * 1024, peak
    # then verify failed on the samples, naming the limit, before any inference
    version.refresh_from_db()
    assert current_build(version).error_field == "sample_inputs"
    assert "'x' alone is 67,108,992" in current_error(version)
    assert "(CONCH_MAX_SAMPLE_UNPACKED_BYTES)" in current_error(version)
    verify = current_build(version).steps.get(name="verify")
    assert verify.status == "failed"
    assert not any("loaded" in line for line in verify.log), verify.log


def test_samples_whose_array_data_is_damaged_are_taken_by_the_upload_and_fail_the_build_naming_them(
    alice, django_capture_on_commit_callbacks, tmp_path
):
    # given samples whose directory and header are sound but whose array data was damaged (CRC-32 mismatch), far
    # enough past the header (32 KiB of data) that reading the header does not reach it (zipfile reads 4 KiB ahead)
    array = np.arange(2048 * 4, dtype=np.float32).reshape(2048, 4)
    buffer = io.BytesIO()
    np.savez(buffer, x=array)
    damaged = bytearray(buffer.getvalue())
    damaged[damaged.index(array.tobytes()) + array.nbytes // 2] ^= 0xFF
    # when a model is uploaded with them: the web process reads only the directory and the headers
    data = add_constant(tmp_path / "add.onnx", 1.0).read_bytes()
    response = upload(
        alice, django_capture_on_commit_callbacks, "adder", data, sample_inputs=SimpleUploadedFile("s.npz", damaged)
    )
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(pk=response.json()["id"])
    assert current_options(version)["samples"]["inputs"] == {"x": {"dtype": "float32", "shape": [2048, 4]}}
    # then the worker, which reads the arrays, fails the build at verify naming the samples, before any inference
    assert run_build(version_id=version.pk, attempt=current_build(version).attempt) == "failed"
    version.refresh_from_db()
    assert current_build(version).error_field == "sample_inputs"
    assert "Array 'x' of the sample inputs file cannot be read (Bad CRC-32" in current_error(version)
    verify = current_build(version).steps.get(name="verify")
    assert verify.status == "failed"
    assert not any("loaded" in line for line in verify.log), verify.log


def test_a_rebuild_takes_sample_values_as_json(alice, eager_tasks, django_capture_on_commit_callbacks):
    version = built(alice, django_capture_on_commit_callbacks, "x", onnx_like(b"\x89PNG\r\n\x1a\n" + b"\0" * 64))
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(
            f"/api/v1/versions/{version['id']}/rebuild", {"sample_values": {"sr": 8000}}, format="json"
        )
    assert response.status_code == 202, response.content
    assert current_options(ModelVersion.objects.get(pk=version["id"]))["samples"] == {"values": {"sr": 8000}}


@pytest.mark.parametrize("body", ['"has sample_values in it"', "[1, 2]"])
def test_a_rebuild_refuses_a_json_body_that_is_not_an_object(
    alice, eager_tasks, django_capture_on_commit_callbacks, body
):
    version = built(alice, django_capture_on_commit_callbacks, "x", onnx_like(b"\x89PNG\r\n\x1a\n" + b"\0" * 64))
    response = alice.client.post(
        f"/api/v1/versions/{version['id']}/rebuild", data=body, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "sample_values"
    assert current_build(ModelVersion.objects.get(pk=version["id"])).attempt == 1
