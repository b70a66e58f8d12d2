"""TensorRT plans (issue 20): packaged as uploaded for Triton's tensorrt backend with the bindings, GPU product and
TensorRT version the upload declares; an Ultralytics metadata header removed; a missing declaration fails the build
naming it; the local runtime refuses the plan naming what it needs. No TensorRT can be installed from PyPI here, so
the plan is a stand-in: the bytes a serialized engine begins with ("ftrt") and random bytes after them, which is
all a build reads of a plan. Builds run inline (eager Celery); a plan's build starts no Triton."""

from __future__ import annotations

import json
import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from models_registry.storage import get_object_store
from tritonserving.config import config_from_pbtxt

pytestmark = [pytest.mark.django_db]

#: A stand-in for a serialized engine (see the module docstring).
PLAN = b"ftrt" + os.urandom(4092)
DECLARED = {
    "input_spec": "images=FP32:-1,3,64,64",
    "output_spec": "scores=FP32:-1,10; labels=INT32:-1",
    "gpu_product": "NVIDIA-A10",
    "tensorrt_version": "10.7.0",
}


def _version(caller, capture, name: str, filename: str, data: bytes, **fields) -> dict:
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    with capture(execute=True):
        response = caller.client.post(
            f"/api/v1/models/{response.json()['id']}/versions/", {"file": SimpleUploadedFile(filename, data), **fields}
        )
    assert response.status_code in (201, 202), response.content
    return caller.client.get(f"/api/v1/versions/{response.json()['id']}/").json()


def _build(caller, version_id: int) -> dict:
    return caller.client.get(f"/api/v1/versions/{version_id}/builds/").json()["results"][0]


def _log(build: dict, step: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in next(s["log"] for s in build["steps"] if s["name"] == step)]


def _repository_plan(build: dict, name: str) -> bytes:
    prefix = build["repository_prefix"]
    return get_object_store().read_bytes(f"{prefix}/{name}/1/model.plan")


def test_a_plan_is_packaged_as_uploaded_with_the_bindings_it_declares(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    version = _version(alice, django_capture_on_commit_callbacks, "detector", "detector.plan", PLAN, **DECLARED)
    assert version["status"] == "built", version["error"]
    build = _build(alice, version["id"])
    assert build["source_format"] == "tensorrt_plan"
    config = config_from_pbtxt(build["config_pbtxt"])
    assert config.backend == "tensorrt" and config.default_model_filename == "model.plan"
    assert [(t.name, list(t.dims)) for t in config.input] == [("images", [-1, 3, 64, 64])]
    assert sorted((t.name, list(t.dims)) for t in config.output) == [("labels", [-1]), ("scores", [-1, 10])]
    assert config.max_batch_size == 0  # a plan's batch range is its own: batching only when asked for
    inspect = _log(build, "inspect")
    assert "assumed: bindings as declared: inputs images; outputs labels, scores" in inspect
    assert any(
        line.startswith("assumed: built for NVIDIA-A10 with TensorRT 10.7.0: deployable only") for line in inspect
    )
    verify = _log(build, "verify")
    assert verify[0].startswith("not verified here: a TensorRT plan runs only on the GPU product and TensorRT")
    assert _repository_plan(build, "detector") == PLAN
    assert build["options"]["gpu_product"] == "NVIDIA-A10" and build["options"]["tensorrt_version"] == "10.7.0"


def test_an_ultralytics_engine_loses_its_metadata_header(alice, eager_tasks, django_capture_on_commit_callbacks):
    header = json.dumps({"description": "Ultralytics YOLO11n", "imgsz": [64, 64], "batch": 1}).encode()
    data = len(header).to_bytes(4, "little") + header + PLAN
    version = _version(alice, django_capture_on_commit_callbacks, "yolo", "yolo11n.engine", data, **DECLARED)
    assert version["status"] == "built", version["error"]
    build = _build(alice, version["id"])
    assert any(
        "the Ultralytics metadata header" in line and "imgsz=[64, 64]" in line for line in _log(build, "inspect")
    )
    assert _repository_plan(build, "yolo") == PLAN


@pytest.mark.parametrize("missing", ["output_spec", "gpu_product", "tensorrt_version"])
def test_a_plan_without_a_declaration_fails_its_build_naming_it(
    alice, eager_tasks, django_capture_on_commit_callbacks, missing
):
    fields = {key: value for key, value in DECLARED.items() if key != missing}
    version = _version(alice, django_capture_on_commit_callbacks, "bare", "m.plan", PLAN, **fields)
    assert version["status"] == "failed" and version["error_field"] == missing
    assert f"{missing} is missing" in version["error"], version["error"]


def test_a_plan_declaration_given_for_another_format_fails_naming_it(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    from tests import real_models

    data = real_models.classifier().read_bytes()
    version = _version(alice, django_capture_on_commit_callbacks, "clf", "clf.onnx", data, gpu_product="NVIDIA-A10")
    assert version["status"] == "failed" and version["error_field"] == "gpu_product"
    assert version["error"].startswith("gpu_product describes a TensorRT plan (.plan), but this model is an ONNX")


def test_the_local_runtime_refuses_a_plan_naming_what_it_needs(alice, eager_tasks, django_capture_on_commit_callbacks):
    version = _version(alice, django_capture_on_commit_callbacks, "detector", "detector.plan", PLAN, **DECLARED)
    body = {"name": "web", "team": alice.team.slug, "model_version": version["id"], "runtime": "local"}
    response = alice.client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 400 and response.json()["field"] == "runtime", response.content
    assert response.json()["detail"].startswith(
        f"Model version {version['id']} is a TensorRT plan built for NVIDIA-A10 with TensorRT 10.7.0: a plan runs "
        "only on the GPU and TensorRT it was built for, and the local runtime has neither."
    )
