"""PyTorch models built end to end (issue 20): an exported program (`torch.export.save`, .pt2) converted to ONNX
with torch.onnx's dynamo exporter, made in the test with a fixed seed, uploaded through the API, served by the
onnxruntime backend on the session's warm Triton and compared output by output with the program itself on the same
inputs; a TorchScript file, a torch.save checkpoint and files named for one and holding the other are told apart.
Builds run inline (eager Celery)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from devtools import torch_models
from tests import real_models
from tests.flows import deploy_ready
from tritonserving.config import config_from_pbtxt

pytestmark = [pytest.mark.django_db, pytest.mark.e2e]


def _upload(caller, capture, name: str, filename: str, data: bytes, **fields) -> tuple[int, dict]:
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    with capture(execute=True):
        response = caller.client.post(
            f"/api/v1/models/{response.json()['id']}/versions/",
            {"file": SimpleUploadedFile(filename, data), **fields},
        )
    return response.status_code, response.json()


def _version(caller, capture, name: str, filename: str, data: bytes, **fields) -> dict:
    status, body = _upload(caller, capture, name, filename, data, **fields)
    assert status in (201, 202), body
    return caller.client.get(f"/api/v1/versions/{body['id']}/").json()


def _build(caller, version_id: int) -> dict:
    return caller.client.get(f"/api/v1/versions/{version_id}/builds/").json()["results"][0]


def _log(build: dict, step: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in next(s["log"] for s in build["steps"] if s["name"] == step)]


def test_an_exported_program_is_converted_served_and_proven_equal_to_torch(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    data = torch_models.exported_program(tmp_path / "classifier.pt2").read_bytes()
    version = _version(alice, django_capture_on_commit_callbacks, "exported", "classifier.pt2", data)
    assert version["status"] == "built", version["error"]
    build = _build(alice, version["id"])
    assert build["source_format"] == "torch_export"
    inspect = _log(build, "inspect")
    assert any(line.startswith("converted with torch.onnx (dynamo exporter, torch 2.13.0") for line in inspect)
    assert "assumed: inputs named as forward's arguments: features" in inspect
    assert "assumed: axis 0, dynamic and shared by every input and output, is the batch axis N" in inspect
    assert "input features: FP32 [-1, 5] axes [N, -]" in inspect
    assert (
        "output output_0: FP32 [-1, 3] axes [N, -]" in inspect
        and "output output_1: FP32 [-1, 3] axes [N, -]" in inspect
    )
    config = config_from_pbtxt(build["config_pbtxt"])
    assert config.backend == "onnxruntime" and config.max_batch_size > 0
    rows = {row["output"]: row for row in build["conversion"]["comparison"]}
    assert set(rows) == {"output_0", "output_1"}
    assert all(row["ok"] and row["max_abs_diff"] < 1e-5 for row in rows.values())
    assert build["conversion"]["opset"] == {"": 18}


@pytest.mark.parametrize(
    ("filename", "make", "says"),
    [
        # a TorchScript file named .pt2
        (
            "model.pt2",
            lambda path: torch_models.torchscript(path),
            "'model.pt2' is named like a PyTorch ExportedProgram",
        ),
        # a torch.save checkpoint named .pt2: weights without a graph
        ("model.pt2", lambda path: torch_models.checkpoint(path), "This is not a PyTorch ExportedProgram"),
    ],
)
def test_a_pt2_name_on_another_pytorch_file_is_refused_at_upload(
    alice, django_capture_on_commit_callbacks, tmp_path, filename, make, says
):
    data = make(tmp_path / "model.bin").read_bytes()
    status, body = _upload(alice, django_capture_on_commit_callbacks, "misnamed", filename, data)
    assert status == 400 and body["field"] == "file", body
    assert body["detail"].startswith(says), body["detail"]


def _assert_served_as_torchscript(caller, version: dict, *, from_what: str) -> dict:
    assert version["status"] == "built", version["error"]
    build = _build(caller, version["id"])
    assert build["source_format"] == "torchscript"
    inspect = _log(build, "inspect")
    assert any(
        line.startswith("read with torch 2.13.0") and "served as uploaded by Triton's pytorch backend" in line
        for line in inspect
    )
    assert f"assumed: inputs named as forward's arguments: features; datatypes and shapes from {from_what}" in inspect
    assert "input features: FP32 [-1, 5] axes [N, -]" in inspect
    assert (
        "output OUTPUT__0: FP32 [-1, 3] axes [N, -]" in inspect
        and "output OUTPUT__1: FP32 [-1, 3] axes [N, -]" in inspect
    )
    config = config_from_pbtxt(build["config_pbtxt"])
    assert config.backend == "pytorch" and config.default_model_filename == "model.pt" and config.max_batch_size > 0
    assert [t.name for t in config.input] == ["features"] and [t.name for t in config.output] == [
        "OUTPUT__0",
        "OUTPUT__1",
    ]
    rows = {row["output"]: row for row in build["conversion"]["comparison"]}
    assert set(rows) == {"OUTPUT__0", "OUTPUT__1"} and all(row["ok"] for row in rows.values())
    assert any("model.pt" in line for line in _log(build, "write_repository"))
    return build


def test_a_scripted_module_is_served_by_the_pytorch_backend_with_the_inputs_input_spec_gives(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    data = torch_models.torchscript(tmp_path / "classifier.pt").read_bytes()
    version = _version(
        alice, django_capture_on_commit_callbacks, "scripted", "classifier.pt", data, input_spec="features=FP32:-1,5"
    )
    build = _assert_served_as_torchscript(alice, version, from_what="input_spec")
    assert build["options"]["input_spec"] == {"features": {"datatype": "FP32", "dims": [-1, 5]}}
    # and the wizard's build page asks for the inputs, pre-filled with those the build used
    browser = Client()
    browser.force_login(alice.user)
    page = browser.get(reverse("console:wizard:build", kwargs={"version_id": version["id"]})).content.decode()
    assert 'name="input_spec" value="features=FP32:-1,5"' in page


def test_a_traced_module_takes_its_inputs_from_the_sample_inputs(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    buffer = io.BytesIO()
    np.savez(buffer, features=np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32))
    data = torch_models.torchscript(tmp_path / "traced.pt", traced=True).read_bytes()
    version = _version(
        alice,
        django_capture_on_commit_callbacks,
        "traced",
        "traced.pth",
        data,
        sample_inputs=SimpleUploadedFile("samples.npz", buffer.getvalue()),
    )
    _assert_served_as_torchscript(alice, version, from_what="the sample inputs")
    browser = Client()
    browser.force_login(alice.user)
    page = browser.get(reverse("console:wizard:build", kwargs={"version_id": version["id"]})).content.decode()
    assert 'name="input_spec" value="features=FP32:-1,5"' in page


def test_a_torchscript_model_without_input_spec_or_samples_fails_saying_what_to_give(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    data = torch_models.torchscript(tmp_path / "classifier.pt").read_bytes()
    version = _version(alice, django_capture_on_commit_callbacks, "bare", "classifier.pt", data)
    assert version["status"] == "failed" and version["error_field"] == "input_spec"
    assert version["error"].startswith(
        "TorchScript does not record its inputs' datatypes and shapes, and neither input_spec nor sample inputs "
        "give one for forward's argument 'features'. Give every input as input_spec (for example features=FP32:-1,5"
    ), version["error"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("x=FP32:-1,5", "input_spec names 'x', which is no argument of the model's forward (features)."),
        ("features=FP32:-1,7", "The model failed on inputs features FP32 [2, 7]: "),
    ],
)
def test_an_input_spec_that_does_not_fit_forward_fails_naming_it(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path, spec, says
):
    data = torch_models.torchscript(tmp_path / "classifier.pt").read_bytes()
    version = _version(alice, django_capture_on_commit_callbacks, "wrong", "classifier.pt", data, input_spec=spec)
    assert version["status"] == "failed" and version["error_field"] == "input_spec"
    assert version["error"].startswith(says), version["error"]


def test_a_real_torchscript_model_with_an_int_argument_is_refused_naming_it(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # silero-vad's own TorchScript file: forward(x: Tensor, sr: int)
    data = real_models.silero_vad_torchscript().read_bytes()
    version = _version(
        alice, django_capture_on_commit_callbacks, "vad", "silero_vad.jit", data, input_spec="x=FP32:-1,512"
    )
    assert version["status"] == "failed" and version["error_field"] == "file"
    assert version["error"].startswith(
        "forward's argument 'sr' is an int, not a tensor, and a served model takes only tensors"
    ), version["error"]
    assert "torch.export" in version["error"]


def test_a_torch_save_checkpoint_is_refused_at_upload_saying_how_to_save_the_model(
    alice, django_capture_on_commit_callbacks, tmp_path
):
    data = torch_models.checkpoint(tmp_path / "weights.pt").read_bytes()
    status, body = _upload(alice, django_capture_on_commit_callbacks, "weights", "weights.pt", data)
    assert status == 400 and body["field"] == "file", body
    assert body["detail"].startswith("This is a PyTorch checkpoint written by torch.save"), body["detail"]
    assert "torch.jit.script(model).save('model.pt')" in body["detail"]


def test_input_spec_given_for_another_format_fails_its_build_naming_the_option(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    data = torch_models.exported_program(tmp_path / "classifier.pt2").read_bytes()
    version = _version(
        alice, django_capture_on_commit_callbacks, "e", "classifier.pt2", data, input_spec="features=FP32:-1,5"
    )
    assert version["status"] == "failed" and version["error_field"] == "input_spec"
    assert version["error"].startswith(
        "input_spec gives a TorchScript model's or a TensorRT plan's inputs (.pt, .plan), but this model is a"
    )


def test_a_deployed_torchscript_model_answers_as_torch_does(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    import torch

    # given the scripted classifier, built and deployed on the local runtime
    data = torch_models.torchscript(tmp_path / "classifier.pt").read_bytes()
    version = _version(
        alice, django_capture_on_commit_callbacks, "served", "classifier.pt", data, input_spec="features=FP32:-1,5"
    )
    assert version["status"] == "built", version["error"]
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, version["id"], "torch")
    # when three rows are sent, asking for the logits only
    x = np.random.default_rng(7).standard_normal((3, 5)).astype(np.float32)
    body = {
        "inputs": [{"name": "features", "shape": [3, 5], "datatype": "FP32", "data": x.ravel().tolist()}],
        "outputs": [{"name": "OUTPUT__1"}],
    }
    response = alice.client.post(f"/api/v1/deployments/{deployment['id']}/infer", body, format="json")
    # then the answer is torch's own
    assert response.status_code == 200, response.content
    [output] = response.json()["outputs"]
    assert output["name"] == "OUTPUT__1" and output["shape"] == [3, 3] and output["datatype"] == "FP32"
    with torch.inference_mode():
        expected = torch_models.classifier()(torch.from_numpy(x))[1].numpy()
    np.testing.assert_allclose(np.array(output["data"]).reshape(3, 3), expected, rtol=1e-5, atol=1e-6)


def test_a_real_pretrained_model_as_torchscript_and_as_an_exported_program_is_served_and_proven_equal(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given MTCNN's O-Net with the pretrained weights facenet-pytorch's wheel ships, saved both ways PyTorch saves
    weights = real_models.mtcnn_onet_weights()
    capture = django_capture_on_commit_callbacks
    # when the TorchScript file is uploaded with its input's datatype and shape
    data = torch_models.mtcnn_onet_torchscript(weights, tmp_path / "onet.pt").read_bytes()
    version = _version(alice, capture, "onet", "onet.pt", data, input_spec="image=FP32:-1,3,48,48")
    # then it is served by the pytorch backend, its three outputs learned and equal to torch's
    assert version["status"] == "built", version["error"]
    build = _build(alice, version["id"])
    assert build["source_format"] == "torchscript"
    inspect = _log(build, "inspect")
    assert "output OUTPUT__0: FP32 [-1, 4] axes [N, -]" in inspect
    assert "output OUTPUT__1: FP32 [-1, 10] axes [N, -]" in inspect
    assert "output OUTPUT__2: FP32 [-1, 2] axes [N, -]" in inspect
    rows = {row["output"]: row for row in build["conversion"]["comparison"]}
    assert set(rows) == {"OUTPUT__0", "OUTPUT__1", "OUTPUT__2"} and all(row["ok"] for row in rows.values()), rows
    browser = Client()
    browser.force_login(alice.user)
    page = browser.get(f"/models/{version['model']}/").content.decode()
    assert "Checked against its own framework" in page and "Served as uploaded by" in page
    assert any(
        "comparing the served model with the TorchScript model run by its own framework" in line
        for line in _log(build, "verify")
    )
    # and when the exported program is uploaded, it is converted to ONNX and proven equal to the program
    data = torch_models.mtcnn_onet_exported(weights, tmp_path / "onet.pt2").read_bytes()
    version = _version(alice, capture, "onet-onnx", "onet.pt2", data)
    assert version["status"] == "built", version["error"]
    build = _build(alice, version["id"])
    assert build["source_format"] == "torch_export"
    assert "input image: FP32 [-1, 3, 48, 48] axes [N, -, -, -]" in _log(build, "inspect")
    rows = {row["output"]: row for row in build["conversion"]["comparison"]}
    assert len(rows) == 3 and all(row["ok"] for row in rows.values()), rows
