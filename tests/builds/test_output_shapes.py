"""Outputs whose declared shape is wrong (issue 19): built with the shape the model returns, or with the shape a
user gives in the build option `output_dims`; refused when the model's output rank varies.

Builds run inline (eager Celery) and verify on a real Triton.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.inspection import ModelSignature, TensorSpec, inspect_onnx
from builds.model_config import (
    BuildOptions,
    build_model_config,
    parse_build_options,
    parse_output_dims,
    with_output_shapes,
)
from builds.packaging import outputs_to_redeclare, package_model_file, redeclare_outputs
from builds.services import current_build, current_error
from builds.verification import merge_observed_shapes
from conch.errors import InvalidInput
from models_registry.models import ModelVersion
from models_registry.storage import get_object_store
from tests.tiny_models import batched_wrong_declared_output, rank_follows_values, wrong_declared_output
from tritonserving.config import config_from_pbtxt

pytestmark = [pytest.mark.django_db]


def _model(caller, name: str) -> int:
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _upload(caller, capture, name: str, data: bytes, **fields):
    with capture(execute=True):
        return caller.client.post(
            f"/api/v1/models/{_model(caller, name)}/versions/",
            {"file": SimpleUploadedFile("model.onnx", data), **fields},
        )


def _version(caller, response) -> dict:
    assert response.status_code in (201, 202), response.content
    return caller.client.get(f"/api/v1/versions/{response.json()['id']}/").json()


def _log(version: dict, step: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in next(s["log"] for s in version["steps"] if s["name"] == step)]


def _output_dims(version: dict) -> list[int]:
    return list(config_from_pbtxt(version["config_pbtxt"]).output[0].dims)


# --- pure parts -----------------------------------------------------------------------------------------------


def test_observed_shapes_merge_to_minus_one_where_runs_differ_and_report_varying_ranks():
    merged = merge_observed_shapes(
        [{"y": (32, 1, 2), "z": ()}, {"y": (48, 1, 2), "z": (0, 0)}, {"other": (1,)}], ["y", "z"]
    )
    assert merged.shapes == {"y": (-1, 1, 2)}
    assert merged.problems == {"z": "[], [0, 0]"}
    assert merge_observed_shapes([{"y": (1, 4)}, {"y": (1, 4)}], ["y"], batch_axis=True).shapes == {"y": (-1, 4)}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("y=-1,1,8210", {"y": (-1, 1, 8210)}),
        ("y=[-1, 1, 8210]; z=[]", {"y": (-1, 1, 8210), "z": ()}),
        ('{"387": [-1, 1, 8210]}', {"387": (-1, 1, 8210)}),
        ({"387": [-1, "1", 8210]}, {"387": (-1, 1, 8210)}),
        ("", None),
        (None, None),
    ],
)
def test_parse_output_dims_reads_text_and_json(raw, expected):
    assert parse_output_dims(raw) == expected


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (
            "y=-2,1",
            "output_dims gives output 'y' the dim '-2'; each dim is a whole number from 0 to 9223372036854775807",
        ),
        ({"y": [1.5]}, "output_dims gives output 'y' the dim 1.5; each dim is a whole number from 0 to"),
        ({"y": [2**63]}, "output_dims gives output 'y' the dim 9223372036854775808; each dim"),
        ({"y": [True]}, "output_dims gives output 'y' the dim True"),
        ("y=a,b", "output_dims gives output 'y' the dim 'a'"),
        ("-1,1,2", "output_dims entry '-1,1,2' is not of the form name=dims"),
        ({"y": 3}, "output_dims gives output 'y' 3, not a list of dims"),
        ("{not json", "output_dims is not a JSON object"),
        ([1, 2], "output_dims must be an object of output name -> dims"),
    ],
)
def test_parse_output_dims_refuses_bad_values_naming_the_field_and_tensor(raw, detail):
    with pytest.raises(InvalidInput) as caught:
        parse_output_dims(raw)
    assert caught.value.field == "output_dims"
    assert caught.value.detail.startswith(detail), caught.value.detail


def test_output_dims_replace_the_declared_shape_and_must_name_an_output():
    signature = ModelSignature(
        inputs=(TensorSpec("x", "FP32", (1, -1), (None, "width")),),
        outputs=(TensorSpec("y", "FP32", (1, -1), (None, "length")),),
        ir_version=8,
        opset=17,
        opset_imports=(("", 17),),
    )
    options = parse_build_options({"output_dims": "y=-1,1,2"})
    assert options.to_dict()["output_dims"] == {"y": [-1, 1, 2]}
    config = build_model_config(name="m", signature=signature, options=options)
    assert list(config.output[0].dims) == [-1, 1, 2]
    with pytest.raises(InvalidInput) as caught:
        build_model_config(name="m", signature=signature, options=BuildOptions(output_dims={"z": (1,)}))
    assert (caught.value.field, caught.value.detail) == (
        "output_dims",
        "output_dims names 'z', which is not an output of the model; its outputs are 'y'.",
    )


def _declared(model: onnx.ModelProto, name: str) -> list[int | str]:
    [value] = [value for value in model.graph.output if value.name == name]
    return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]


def _run(data: bytes, width: int) -> np.ndarray:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = np.arange(width, dtype=np.float32).reshape(1, width)
    [y] = session.run(["y"], {"x": x})
    return y


def test_outputs_to_redeclare_follows_tritons_onnxruntime_backend_rule():
    # given the file's y [1, -1] and x [1, -1] (not batching)
    signature = ModelSignature(
        inputs=(TensorSpec(name="x", datatype="FP32", dims=(1, -1), dim_names=(None, "width")),),
        outputs=(
            TensorSpec(name="y", datatype="FP32", dims=(1, -1), dim_names=(None, "length")),
            TensorSpec(name="s", datatype="FP32", dims=(), dim_names=()),
        ),
        ir_version=9,
        opset=17,
        opset_imports=(("", 17),),
    )
    config = build_model_config(name="ocr", signature=signature, options=BuildOptions())
    # then the configuration the file declares needs no rewrite (a scalar configured as dims [1] included)
    assert outputs_to_redeclare(config, signature) == {}
    # and another rank, or a size where the file has -1 (compared exactly), does
    assert outputs_to_redeclare(with_output_shapes(config, {"y": (-1, 1, 2)}), signature) == {"y": (-1, 1, 2)}
    assert outputs_to_redeclare(with_output_shapes(config, {"y": (1, 8)}), signature) == {"y": (1, 8)}
    assert outputs_to_redeclare(with_output_shapes(config, {"s": (2,)}), signature) == {"s": (2,)}


def test_redeclared_outputs_keep_the_graph_and_its_results(tmp_path):
    # given the model whose file declares y [1, length] but returns [width / 2, 1, 2]
    source = wrong_declared_output(tmp_path / "m.onnx")
    original = onnx.load(source)
    model = onnx.load(source, load_external_data=False)
    # when y is redeclared as [-1, 1, 2]
    redeclare_outputs(model, {"y": (-1, 1, 2)})
    # then y declares the new shape (a named axis of its own for -1) and nothing else changed
    assert _declared(model, "y") == ["conch_0_dim_0", 1, 2]
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    model.graph.output[0].type.tensor_type.shape.CopyFrom(original.graph.output[0].type.tensor_type.shape)
    assert model.SerializeToString() == original.SerializeToString()
    # and onnxruntime gives the same outputs for the rewritten file
    redeclare_outputs(model, {"y": (-1, 1, 2)})
    for width in (4, 10):
        np.testing.assert_array_equal(_run(model.SerializeToString(), width), _run(source.read_bytes(), width))
    # and a kept rank keeps the file's own axis names
    redeclare_outputs(model, {"y": (-1, 1, -1)})
    assert _declared(model, "y") == ["conch_0_dim_0", 1, "conch_0_dim_2"]
    kept = onnx.load(source)
    redeclare_outputs(kept, {"y": (-1, -1)})
    assert _declared(kept, "y") == ["conch_0_dim_0", "length"]
    with pytest.raises(KeyError, match="'z'"):
        redeclare_outputs(model, {"z": (1,)})


def test_package_model_file_rewrites_only_the_repository_copy(tmp_path):
    # given an uploaded model whose file declares y [1, length]
    source = wrong_declared_output(tmp_path / "m.onnx")
    store = get_object_store()
    store.put_bytes("uploads/packaging-test/model.onnx", source.read_bytes())
    uploaded = hashlib.sha256(source.read_bytes()).hexdigest()
    signature = inspect_onnx(source)
    config = with_output_shapes(
        build_model_config(name="ocr", signature=signature, options=BuildOptions()), {"y": (-1, 1, 2)}
    )
    # when it is packaged for a configuration giving y [-1, 1, 2]
    packaged = package_model_file(
        store=store,
        source_key="uploads/packaging-test/model.onnx",
        source_file=source,
        model_key="repos/packaging-test/ocr/1/model.onnx",
        config=config,
        signature=signature,
    )
    # then the repository's copy declares it, and the upload and the local file are unchanged
    assert packaged.redeclared == {"y": ((1, -1), (-1, 1, 2))}
    stored = store.read_bytes("repos/packaging-test/ocr/1/model.onnx")
    assert packaged.size_bytes == len(stored)
    assert _declared(onnx.load_from_string(stored), "y") == ["conch_0_dim_0", 1, 2]
    assert hashlib.sha256(store.read_bytes("uploads/packaging-test/model.onnx")).hexdigest() == uploaded
    assert hashlib.sha256(source.read_bytes()).hexdigest() == uploaded
    np.testing.assert_array_equal(_run(stored, 6), _run(source.read_bytes(), 6))
    # and a configuration that agrees with the file stores the upload as it is
    again = package_model_file(
        store=store,
        source_key="uploads/packaging-test/model.onnx",
        source_file=source,
        model_key="repos/packaging-test/ocr/1/model.onnx",
        config=build_model_config(name="ocr", signature=signature, options=BuildOptions()),
        signature=signature,
    )
    assert again.redeclared == {}
    assert store.read_bytes("repos/packaging-test/ocr/1/model.onnx") == source.read_bytes()


# --- builds on a real Triton ----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_wrongly_declared_output_is_built_with_the_observed_shape(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given a model whose file declares y [1, length] but which returns [width / 2, 1, 2]
    data = wrong_declared_output(tmp_path / "m.onnx").read_bytes()
    # when it is uploaded with no options
    version = _version(alice, _upload(alice, django_capture_on_commit_callbacks, "ocr", data))
    # then it is built with the shape observed on two samples of other widths (64 and 96): axis 0 varies
    assert version["status"] == "built", version["error"]
    assert _output_dims(version) == [-1, 1, 2]
    verify = _log(version, "verify")
    assert "output y: [32, 1, 2]" in verify
    assert "probe output y: [48, 1, 2]" in verify
    assert (
        "output y: the model file declares [1, -1], but the model returned [32, 1, 2], [48, 1, 2]; config.pbtxt "
        "gives it the observed shape [-1, 1, 2] (-1 where the runs differed). To give another shape, rebuild with "
        "output_dims (e.g. y=-1,...)"
    ) in verify
    # and what is stored is what the version says
    store = get_object_store()
    stored = store.read_bytes(f"{version['repository_prefix']}/ocr/config.pbtxt").decode()
    assert stored == version["config_pbtxt"]
    # and the repository's model file declares that shape, as Triton's onnxruntime backend needs, and gives the same
    # outputs; the uploaded file is kept as it was
    model_key = f"{version['repository_prefix']}/ocr/{version['number']}/model.onnx"
    packaged = store.read_bytes(model_key)
    assert _declared(onnx.load_from_string(packaged), "y") == ["conch_0_dim_0", 1, 2]
    np.testing.assert_array_equal(_run(packaged, 8), _run(data, 8))
    assert ModelVersion.objects.get(pk=version["id"]).source_key != model_key
    assert store.read_bytes(ModelVersion.objects.get(pk=version["id"]).source_key) == data
    assert (
        f"{model_key}: output y now declares [-1, 1, 2] in place of the uploaded file's [1, -1], as config.pbtxt "
        "does (Triton's onnxruntime backend loads a model only when the two agree); only the repository's copy "
        "changed, the uploaded file is kept as it was"
    ) in verify


@pytest.mark.e2e
def test_a_wrongly_declared_output_of_a_batching_model_keeps_batching_with_the_observed_shape(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given a batchable model whose file declares y [batch, 4] but which returns [batch, 1, 4]
    data = batched_wrong_declared_output(tmp_path / "m.onnx").read_bytes()
    version = _version(alice, _upload(alice, django_capture_on_commit_callbacks, "adder", data))
    # then it is built with batching, y's dims the observed shape after the batch axis, and batching proven
    assert version["status"] == "built", version["error"]
    config = config_from_pbtxt(version["config_pbtxt"])
    assert config.max_batch_size == 8
    assert list(config.output[0].dims) == [1, 4]
    verify = _log(version, "verify")
    assert (
        "output y: the model file declares [-1, 4], but the model returned [1, 1, 4], [1, 1, 4], [1, 1, 4]; "
        "config.pbtxt gives it the observed shape [-1, 1, 4] (-1 where the runs differed). To give another shape, "
        "rebuild with output_dims (e.g. y=-1,...)"
    ) in verify
    assert any(line.startswith("batching proven:") for line in verify), verify
    # and the repository's model file declares y [-1, 1, 4], the batch axis dynamic, as config.pbtxt does
    packaged = get_object_store().read_bytes(f"{version['repository_prefix']}/adder/{version['number']}/model.onnx")
    assert _declared(onnx.load_from_string(packaged), "y") == ["conch_0_dim_0", 1, 4]


@pytest.mark.e2e
def test_an_output_whose_rank_varies_fails_saying_how_to_give_its_shape(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given a model whose output is a scalar (sent as [1]) for s = [1, 1] and [0, 0] for s = [0, 0], declared [5]
    data = rank_follows_values(tmp_path / "m.onnx").read_bytes()
    # when it is uploaded
    version = _version(alice, _upload(alice, django_capture_on_commit_callbacks, "ranks", data))
    # then the build fails at verify, naming the shapes and how to give one
    assert version["status"] == "failed"
    assert version["error_field"] == "output_dims"
    assert version["error"] == (
        "Output 'y' came back with shapes of different ranks for the verify step's samples ([1], [0, 0]), and the "
        "model file declares [5], so Conch cannot tell which shape to give it in config.pbtxt (Triton needs one "
        "rank per output). If the model returns one rank for the requests it will serve, give that shape yourself "
        "with the build option output_dims, the output's full shape with -1 for an axis of any size: POST "
        f'/api/v1/versions/{version["id"]}/rebuild with {{"output_dims": {{"y": [-1, -1]}}}} (or -F '
        "output_dims='y=-1,-1' with an upload), and send sample_inputs like those requests."
    )


@pytest.mark.e2e
def test_output_dims_given_on_upload_are_built_without_a_probe(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    data = wrong_declared_output(tmp_path / "m.onnx").read_bytes()
    response = _upload(alice, django_capture_on_commit_callbacks, "ocr", data, output_dims="y=-1,1,2")
    version = _version(alice, response)
    assert version["status"] == "built", version["error"]
    assert version["build_options"]["output_dims"] == {"y": [-1, 1, 2]}
    assert _output_dims(version) == [-1, 1, 2]
    assert "output y: FP32 [1, -1] axes [-, length]" in _log(version, "inspect")
    assert not any(line.startswith("probe") for line in _log(version, "verify"))
    # and the write step already packaged a model file declaring the given shape
    model_key = f"{version['repository_prefix']}/ocr/{version['number']}/model.onnx"
    assert any(
        line.startswith(f"{model_key}: output y now declares [-1, 1, 2]") for line in _log(version, "write_repository")
    )
    packaged = get_object_store().read_bytes(model_key)
    assert _declared(onnx.load_from_string(packaged), "y") == ["conch_0_dim_0", 1, 2]


@pytest.mark.e2e
def test_wrong_output_dims_fail_the_build_and_a_rebuild_with_the_right_ones_builds(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given an upload whose output_dims are not what the model returns
    data = wrong_declared_output(tmp_path / "m.onnx").read_bytes()
    response = _upload(alice, django_capture_on_commit_callbacks, "ocr", data, output_dims="y=-1,2")
    version = _version(alice, response)
    # then the user's shape is not overruled: the build fails naming output_dims
    assert version["status"] == "failed"
    assert version["error_field"] == "output_dims"
    assert version["error"].startswith(
        "output_dims gives output 'y' the shape [-1, 2], but the model returned [32, 1, 2] for the verify step's "
        "samples."
    )
    # when it is rebuilt with the right shape
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(
            f"/api/v1/versions/{version['id']}/rebuild", {"output_dims": {"y": [-1, 1, 2]}}, format="json"
        )
    version = _version(alice, response)
    # then it is built with it
    assert version["status"] == "built", version["error"]
    assert version["build_options"]["output_dims"] == {"y": [-1, 1, 2]}
    assert _output_dims(version) == [-1, 1, 2]


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"output_dims": "y=-1,x"}, "output_dims gives output 'y' the dim 'x'"),
        ({"output_dims": "y=-5"}, "output_dims gives output 'y' the dim '-5'"),
    ],
)
def test_upload_refuses_bad_output_dims_naming_the_field_and_tensor(
    alice, django_capture_on_commit_callbacks, tmp_path, fields, detail
):
    data = wrong_declared_output(tmp_path / "m.onnx").read_bytes()
    response = _upload(alice, django_capture_on_commit_callbacks, "ocr", data, **fields)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "output_dims"
    assert response.json()["detail"].startswith(detail)
    assert not ModelVersion.objects.exists()


def test_rebuild_refuses_output_dims_naming_no_output_of_the_model(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path, settings
):
    # given a version inspected but failed (its wrong output_dims stop it at verify; no Triton needed to refuse)
    data = wrong_declared_output(tmp_path / "m.onnx").read_bytes()
    version = ModelVersion.objects.get(
        pk=_upload(alice, django_capture_on_commit_callbacks, "ocr", data, output_dims="zz=1").json()["id"]
    )
    assert version.status == "failed" and current_build(version).error_field == "output_dims"
    assert current_error(version) == "output_dims names 'zz', which is not an output of the model; its outputs are 'y'."
    # when a rebuild names an output the model does not have, or a bad dim
    url = f"/api/v1/versions/{version.pk}/rebuild"
    unknown = alice.client.post(url, {"output_dims": {"nope": [1]}}, format="json")
    bad = alice.client.post(url, {"output_dims": {"y": [-1, "many"]}}, format="json")
    # then 400 naming the field and the tensor, and nothing is queued
    assert unknown.status_code == 400, unknown.content
    assert unknown.json() == {
        "detail": "output_dims names 'nope', which is not an output of the model; its outputs are 'y'.",
        "field": "output_dims",
    }
    assert bad.status_code == 400 and bad.json()["field"] == "output_dims"
    assert bad.json()["detail"].startswith("output_dims gives output 'y' the dim 'many'")
    version.refresh_from_db()
    assert (version.status, current_build(version).attempt) == ("failed", 1)
