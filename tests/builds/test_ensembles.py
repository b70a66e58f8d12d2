"""Pipelines checked as graphs before they deploy (`builds.ensembles`), and the ensemble configuration generated from
them loaded and run by a real Triton, which also refuses what the checks refuse."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton_http
from onnx import TensorProto, helper

from builds.ensembles import (
    PipelineSpec,
    StepSpec,
    TensorType,
    check_pipeline,
    ensemble_config,
    pipeline_from_config,
)
from conch.errors import InvalidInput
from tritonserving.config import config_from_pbtxt, config_to_pbtxt, datatype_value
from tritonserving.server import allocate_ports, ensure_backend_directory, start_server, stop_server, wait_until_ready

API_KEY = "e" * 64


def _config(text: str) -> object:
    return config_from_pbtxt(text)


#: An OCR-like chain: detection gives crops as UINT8 HWC, recognition wants FP32 CHW.
MODELS = {
    "det": _config(
        'name: "det" backend: "onnxruntime" max_batch_size: 8 '
        'input [{name: "image" data_type: TYPE_UINT8 dims: [-1, -1, 3]}] '
        'output [{name: "crops" data_type: TYPE_UINT8 dims: [48, -1, 3]}, '
        '{name: "scores" data_type: TYPE_FP32 dims: [1]}]'
    ),
    "rec": _config(
        'name: "rec" backend: "onnxruntime" max_batch_size: 8 '
        'input [{name: "x" data_type: TYPE_FP32 dims: [3, 48, -1]}] '
        'output [{name: "logits" data_type: TYPE_FP32 dims: [-1, 97]}]'
    ),
    "norm": _config(
        'name: "norm" backend: "python" max_batch_size: 8 '
        'input [{name: "crops" data_type: TYPE_UINT8 dims: [48, -1, 3]}] '
        'output [{name: "x" data_type: TYPE_FP32 dims: [3, 48, -1]}]'
    ),
}


def _pipeline(steps, *, outputs=("logits",), inputs=None, max_batch_size=8) -> PipelineSpec:
    return PipelineSpec(
        name="ocr",
        inputs=inputs or {"image": TensorType("UINT8", (-1, -1, 3))},
        outputs=outputs,
        steps=tuple(steps),
        max_batch_size=max_batch_size,
    )


DET = StepSpec(model="det", inputs={"image": "image"}, outputs={"crops": "crops"})
NORM = StepSpec(model="norm", inputs={"crops": "crops"}, outputs={"x": "tensor_x"})
REC = StepSpec(model="rec", inputs={"x": "tensor_x"}, outputs={"logits": "logits"})


def _refusals(spec: PipelineSpec, models=MODELS) -> list[str]:
    with pytest.raises(InvalidInput) as refused:
        check_pipeline(spec, models)
    assert refused.value.field == "steps"
    return [error.detail for error in (refused.value.refusals or (refused.value,))]


def test_a_well_wired_pipeline_is_ordered_and_its_outputs_typed():
    checked = check_pipeline(_pipeline([REC, NORM, DET]), MODELS)
    assert checked.order == ("det", "norm", "rec")
    assert checked.tensors["logits"].describe() == "FP32 [-1, -1, 97]"
    config = ensemble_config(_pipeline([REC, NORM, DET]), checked)
    assert config.platform == "ensemble" and config.max_batch_size == 8
    assert [step.model_name for step in config.ensemble_scheduling.step] == ["det", "norm", "rec"]
    assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [-1, 97])]
    # and the configuration read back is the same pipeline
    again = pipeline_from_config(config_from_pbtxt(config_to_pbtxt(config)))
    assert check_pipeline(again, MODELS).order == ("det", "norm", "rec")


def test_steps_that_disagree_on_a_datatype_or_shape_are_named_with_both_sides():
    crop_to_rec = StepSpec(model="rec", name="rec", inputs={"x": "crops"}, outputs={"logits": "logits"})
    [detail] = _refusals(_pipeline([StepSpec(model="det", name="crop", **_io(DET)), crop_to_rec]))
    assert detail == (
        "Step `rec` expects FP32 [-1, 3, 48, -1] as its input 'x' (tensor 'crops'); step `crop` gives "
        "UINT8 [-1, 48, -1, 3]."
    )


def _io(step: StepSpec) -> dict:
    return {"inputs": step.inputs, "outputs": step.outputs}


def test_every_wiring_mistake_is_told_at_once():
    details = _refusals(
        _pipeline(
            [
                StepSpec(model="det", inputs={"image": "image"}, outputs={"crops": "crops", "scores": "scores"}),
                StepSpec(model="rec", inputs={"x": "missing"}, outputs={"logits": "logits", "nope": "n"}),
                StepSpec(model="ghost", inputs={}, outputs={}),
            ],
            outputs=("logits", "text"),
        )
    )
    assert "Step `ghost` runs model 'ghost', which the pipeline has no model of (models: det, norm, rec)." in details
    assert "Step `rec` maps 'nope', which model 'rec' has no output of (its outputs: logits)." in details
    assert (
        "Step `rec` takes tensor 'missing' as its input 'x', but no step gives it and it is not a pipeline input."
    ) in details
    assert "Pipeline output 'text' is given by no step; map a step's output to it." in details
    assert any(d.startswith("Tensor 'crops' of step `det` is used by nothing") for d in details)
    assert any(d.startswith("Tensor 'scores' of step `det` is used by nothing") for d in details)


def test_unmapped_inputs_two_producers_unused_inputs_and_batch_sizes_are_refused():
    details = _refusals(
        _pipeline(
            [DET, StepSpec(model="norm", inputs={}, outputs={"x": "crops"}), REC],
            inputs={"image": TensorType("UINT8", (-1, -1, 3)), "mask": TensorType("BOOL", (1,))},
            max_batch_size=16,
        )
    )
    assert any(
        d.startswith("Step `norm`: input 'crops' of model 'norm' (UINT8 [-1, 48, -1, 3]) is fed by no") for d in details
    )
    assert (
        "Tensor 'crops' is given by step `det` and by step `norm`; each tensor has one producer: rename one of them."
        in details
    )
    assert "Pipeline input 'mask' is used by no step; map it to a step's input or remove it." in details
    assert any(
        d.startswith("The pipeline takes batches of up to 16, but step `det`'s model 'det' batches at most 8")
        for d in details
    )


def test_a_cycle_is_named_by_its_steps():
    a = StepSpec(model="norm", name="a", inputs={"crops": "from_b"}, outputs={"x": "tensor_x"})
    b = StepSpec(model="det", name="b", inputs={"image": "image"}, outputs={"crops": "from_b"})
    loop_one = StepSpec(model="rec", name="c", inputs={"x": "tensor_x"}, outputs={"logits": "logits"})
    assert check_pipeline(_pipeline([a, b, loop_one]), MODELS).order == ("b", "a", "c")
    models = {
        "one": _config(
            'name: "one" backend: "python" max_batch_size: 0 input [{name: "i" data_type: TYPE_FP32 dims: [1]}] '
            'output [{name: "o" data_type: TYPE_FP32 dims: [1]}]'
        )
    }
    first = StepSpec(model="one", name="first", inputs={"i": "t2"}, outputs={"o": "t1"})
    second = StepSpec(model="one", name="second", inputs={"i": "t1"}, outputs={"o": "t2"})
    last = StepSpec(model="one", name="last", inputs={"i": "x"}, outputs={"o": "y"})
    spec = PipelineSpec(
        name="loop", inputs={"x": TensorType("FP32", (1,))}, outputs=("y",), steps=(first, second, last)
    )
    details = _refusals(spec, models)
    assert any(d.startswith("Steps `first` → `second` → `first` form a cycle") for d in details), details


# --- the same rules in a real Triton -------------------------------------------------------------------------------


def _onnx_model(path, op: str, constant: float) -> None:
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "c"], ["y"])],
        op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[helper.make_tensor("c", TensorProto.FLOAT, [1], [constant])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.parent.mkdir(parents=True)
    path.write_bytes(model.SerializeToString())


def _step_config(name: str) -> str:
    return (
        f'name: "{name}" backend: "onnxruntime" max_batch_size: 8 '
        'input [{name: "x" data_type: TYPE_FP32 dims: [4]}] output [{name: "y" data_type: TYPE_FP32 dims: [4]}]'
    )


@pytest.mark.triton
def test_the_generated_ensemble_runs_on_triton_and_triton_refuses_what_the_check_refuses(tmp_path):
    # given two models, x + 1 and x * 3, in a repository
    repository = tmp_path / "repository"
    _onnx_model(repository / "plus" / "1" / "model.onnx", "Add", 1.0)
    _onnx_model(repository / "times" / "1" / "model.onnx", "Mul", 3.0)
    models = {name: config_from_pbtxt(_step_config(name)) for name in ("plus", "times")}
    for name, config in models.items():
        (repository / name / "config.pbtxt").write_text(config_to_pbtxt(config))
    spec = PipelineSpec(
        name="chain",
        inputs={"input": TensorType("FP32", (4,))},
        outputs=("output",),
        steps=(
            StepSpec(model="times", inputs={"x": "plus_y"}, outputs={"y": "output"}),
            StepSpec(model="plus", inputs={"x": "input"}, outputs={"y": "plus_y"}),
        ),
        max_batch_size=8,
    )
    config = ensemble_config(spec, check_pipeline(spec, models))
    (repository / "chain" / "1").mkdir(parents=True)
    (repository / "chain" / "config.pbtxt").write_text(config_to_pbtxt(config))
    # and an ensemble whose steps disagree on a datatype, which the check refuses
    bad = config_from_pbtxt(config_to_pbtxt(config))
    bad.name = "broken"
    bad.input[0].data_type = datatype_value("FP16")  # the step plus takes FP32
    (repository / "broken" / "1").mkdir(parents=True)
    (repository / "broken" / "config.pbtxt").write_text(config_to_pbtxt(bad))
    with pytest.raises(InvalidInput) as refused:
        check_pipeline(pipeline_from_config(bad), models)
    assert "Step `plus` expects FP32 [-1, 4] as its input 'x' (tensor 'input'); the pipeline input FP16 [-1, 4]." in (
        refused.value.detail
    )
    http_port, grpc_port, metrics_port = allocate_ports(3)
    process = start_server(
        server_id="conchtest-ensembles",
        repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_path=tmp_path / "triton.log",
        backend_root=ensure_backend_directory(tmp_path / "backends"),
        api_key=API_KEY,
    )
    try:
        wait_until_ready(process, timeout_s=60)
        client = triton_http.InferenceServerClient(process.http_url.removeprefix("http://"))
        headers = {"X-Conch-Key": API_KEY}
        for name in ("plus", "times", "chain"):
            client.load_model(name, headers=headers)
        # then Triton runs the generated ensemble: (x + 1) * 3
        x = np.array([[0.0, 1.0, 2.0, 3.0]], dtype=np.float32)
        tensor = triton_http.InferInput("input", [1, 4], "FP32")
        tensor.set_data_from_numpy(x)
        answer = client.infer("chain", [tensor]).as_numpy("output")
        np.testing.assert_allclose(answer, (x + 1) * 3)
        # and refuses the ensemble the check refused
        with pytest.raises(Exception) as triton_refused:
            client.load_model("broken", headers=headers)
        assert "inconsistent data type" in str(triton_refused.value), triton_refused.value
    finally:
        stop_server(process.pid, process.create_time, timeout_s=10)


def _zip(files: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, data in files.items():
            bundle.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.django_db
def test_an_uploaded_repository_s_ensemble_is_checked_before_it_is_refused(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    from django.core.files.uploadedfile import SimpleUploadedFile

    _onnx_model(tmp_path / "plus.onnx" / "model.onnx", "Add", 1.0)
    _onnx_model(tmp_path / "times.onnx" / "model.onnx", "Mul", 3.0)
    models = {name: config_from_pbtxt(_step_config(name)) for name in ("plus", "times")}
    spec = PipelineSpec(
        name="chain",
        inputs={"input": TensorType("FP32", (4,))},
        outputs=("output",),
        steps=(
            StepSpec(model="plus", inputs={"x": "input"}, outputs={"y": "plus_y"}),
            StepSpec(model="times", inputs={"x": "plus_y"}, outputs={"y": "output"}),
        ),
        max_batch_size=8,
    )
    good = ensemble_config(spec, check_pipeline(spec, models))
    bad = config_from_pbtxt(config_to_pbtxt(good))
    bad.input[0].data_type = datatype_value("FP16")

    def upload(name: str, ensemble) -> dict:
        files = {
            "chain/config.pbtxt": config_to_pbtxt(ensemble).encode(),
            "chain/1/.keep": b"",
            "plus/config.pbtxt": config_to_pbtxt(models["plus"]).encode(),
            "plus/1/model.onnx": (tmp_path / "plus.onnx" / "model.onnx").read_bytes(),
            "times/config.pbtxt": config_to_pbtxt(models["times"]).encode(),
            "times/1/model.onnx": (tmp_path / "times.onnx" / "model.onnx").read_bytes(),
        }
        model = alice.client.post("/api/v1/models/", {"name": name, "team": alice.team.slug}, format="json").json()
        with django_capture_on_commit_callbacks(execute=True):
            response = alice.client.post(
                f"/api/v1/models/{model['id']}/versions/", {"file": SimpleUploadedFile("repo.zip", _zip(files))}
            )
        return alice.client.get(f"/api/v1/versions/{response.json()['id']}/").json()

    # a mis-typed ensemble is refused naming the step, the tensor and both sides
    refused = upload("chain", bad)
    assert refused["status"] == "failed" and refused["error_field"] == "steps", refused
    assert (
        "Step `plus` expects FP32 [-1, 4] as its input 'x' (tensor 'input'); the pipeline input FP16 [-1, 4]."
        in (refused["error"])
    )
