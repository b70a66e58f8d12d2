"""Tests for builds.verification: sample inputs run through the real models in onnxruntime, shape checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from builds.inspection import inspect_onnx
from builds.model_config import BuildOptions, build_model_config
from builds.verification import VerificationError, check_output_shapes, make_sample_inputs
from conch.errors import InvalidInput
from tests import real_models
from tritonserving.config import ModelConfig, config_from_pbtxt


def config_for(model: Callable[[], Path]) -> ModelConfig:
    return build_model_config(name="m", signature=inspect_onnx(model()), options=BuildOptions())


def run_in_onnxruntime(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Run one inference on the CPU; return output name -> shape."""
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return {name: value.shape for name, value in zip(names, session.run(names, inputs), strict=True)}


# --- sample inputs -------------------------------------------------------------------------------------------


def test_make_sample_inputs_for_the_classifier_is_one_seeded_float_image():
    # given the classifier's configuration (batching on)
    config = config_for(real_models.classifier)

    # when
    samples = make_sample_inputs(config)

    # then: a batch of one, float32 in [0, 1), identical on every call with the same seed
    assert list(samples) == ["x"]
    assert (samples["x"].shape, samples["x"].dtype) == ((1, 3, 224, 224), np.float32)
    assert 0.0 <= samples["x"].min() and samples["x"].max() < 1.0
    assert np.array_equal(samples["x"], make_sample_inputs(config)["x"])
    assert not np.array_equal(samples["x"], make_sample_inputs(config, seed=1)["x"])


def test_make_sample_inputs_for_the_text_embedder_is_ones_of_sequence_64():
    # given MiniLM's configuration: three INT64 [batch, sequence] inputs
    samples = make_sample_inputs(config_for(real_models.minilm))

    # then every input is int64 ones of shape [1, 64]
    assert list(samples) == ["input_ids", "attention_mask", "token_type_ids"]
    for array in samples.values():
        assert (array.shape, array.dtype) == ((1, 64), np.int64)
        assert np.array_equal(array, np.ones((1, 64), dtype=np.int64))


def test_make_sample_inputs_without_batching_uses_the_full_dims():
    # given ddddocr's configuration: max_batch_size 0, dims [1, 1, 64, -1]
    samples = make_sample_inputs(config_for(real_models.ddddocr_common))

    # then no batch axis is added and the dynamic width is 64
    assert (samples["input1"].shape, samples["input1"].dtype) == ((1, 1, 64, 64), np.float32)


def test_make_sample_inputs_fills_dynamic_axes_with_the_given_size():
    samples = make_sample_inputs(config_for(real_models.ocr_det), dynamic_size=96)
    assert samples["x"].shape == (1, 3, 96, 96)


def test_make_sample_inputs_for_bool_bytes_fp16_and_uint8():
    # given a hand-written config with other datatypes
    config = config_from_pbtxt(
        'name: "m" backend: "onnxruntime" max_batch_size: 4 '
        'input { name: "mask" data_type: TYPE_BOOL dims: [2] } '
        'input { name: "text" data_type: TYPE_STRING dims: [1] } '
        'input { name: "half" data_type: TYPE_FP16 dims: [-1] } '
        'input { name: "pixels" data_type: TYPE_UINT8 dims: [2, 2] } '
        'output { name: "y" data_type: TYPE_FP32 dims: [1] }'
    )

    # when
    samples = make_sample_inputs(config, dynamic_size=3)

    # then
    assert np.array_equal(samples["mask"], np.ones((1, 2), dtype=bool))
    assert samples["text"].dtype == np.object_
    assert samples["text"].tolist() == [[b"conch"]]
    assert (samples["half"].shape, samples["half"].dtype) == ((1, 3), np.float16)
    assert np.array_equal(samples["pixels"], np.ones((1, 2, 2), dtype=np.uint8))


def test_make_sample_inputs_rejects_a_dynamic_size_below_one():
    with pytest.raises(ValueError, match="dynamic_size must be at least 1, got 0"):
        make_sample_inputs(config_for(real_models.classifier), dynamic_size=0)


# --- sample inputs through the real models -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (real_models.classifier, {"fetch_name_0": (1, 4)}),
        (real_models.minilm, {"last_hidden_state": (1, 64, 384)}),
        (real_models.ocr_det, {"sigmoid_0.tmp_0": (1, 1, 64, 64)}),
        (real_models.ocr_cls, {"save_infer_model/scale_0.tmp_1": (1, 2)}),
        (real_models.ocr_rec, {"softmax_11.tmp_0": (1, 8, 6625)}),
        (real_models.magika, {"target_label": (1, 214)}),
    ],
)
def test_sample_inputs_run_through_each_real_model_and_pass_the_shape_check(model, expected):
    # given a real model's configuration and its sample inputs
    config = config_for(model)
    samples = make_sample_inputs(config)

    # when they run through onnxruntime
    shapes = run_in_onnxruntime(model(), samples)

    # then the model accepts them and its outputs match the configuration
    assert shapes == expected
    check_output_shapes(config, shapes, batch_size=1)


def test_check_output_shapes_catches_ddddocrs_wrongly_declared_output():
    # given ddddocr, whose file declares output '387' as [1, seqlen]
    config = config_for(real_models.ddddocr_common)
    samples = make_sample_inputs(config)

    # when a sample really runs, the output comes back with rank 3
    shapes = run_in_onnxruntime(real_models.ddddocr_common(), samples)
    assert shapes == {"387": (8, 1, 8210)}

    # then the check names the tensor, the declared and the actual shape
    with pytest.raises(VerificationError) as caught:
        check_output_shapes(config, shapes, batch_size=1)
    assert isinstance(caught.value, InvalidInput)
    assert caught.value.field == "file"
    assert caught.value.detail == (
        "Output '387' came back with shape [8, 1, 8210], but the configuration declares [1, -1]; -1 means any "
        "size (rank 3 produced, rank 2 declared). The model file declares the wrong shape for this output, so "
        "Triton would describe it wrongly to clients and may refuse it. Fix the output's declared shape in the "
        "ONNX graph (for example export again with correct dynamic_axes, or edit graph.output with the onnx "
        "package) and upload the model again."
    )


# --- the shape check on its own ------------------------------------------------------------------------------


def test_check_output_shapes_reports_a_missing_output():
    config = config_for(real_models.classifier)
    with pytest.raises(VerificationError) as caught:
        check_output_shapes(config, {"logits": (1, 4)}, batch_size=1)
    assert caught.value.detail == (
        "The sample inference did not return output 'fetch_name_0', which the configuration declares; it returned "
        "'logits'. The model's outputs differ from what inspection found: upload the model again, and if this "
        "repeats, export it with fixed output names."
    )


def test_check_output_shapes_includes_the_batch_axis_in_the_declared_shape():
    # given the classifier (batching) and an output whose batch axis does not match the request
    config = config_for(real_models.classifier)

    # when / then
    with pytest.raises(VerificationError) as caught:
        check_output_shapes(config, {"fetch_name_0": (2, 4)}, batch_size=1)
    assert caught.value.detail.startswith(
        "Output 'fetch_name_0' came back with shape [2, 4], but the configuration declares [1, 4], where the first "
        "axis is the batch of 1; -1 means any size."
    )


def test_check_output_shapes_accepts_any_size_on_dynamic_axes_and_ignores_extra_outputs():
    config = config_for(real_models.minilm)
    check_output_shapes(config, {"last_hidden_state": (3, 17, 384), "pooled": (3, 384)}, batch_size=3)


def test_check_output_shapes_accepts_the_reshape_shape_of_a_batch_only_output():
    # given an output declared as dims [1] with an empty reshape (a [batch] tensor)
    config = config_from_pbtxt(
        'name: "m" max_batch_size: 4 input { name: "x" data_type: TYPE_FP32 dims: [3] } '
        'output { name: "score" data_type: TYPE_FP32 dims: [1] reshape { } }'
    )

    # then both the client shape [2, 1] and the model shape [2] pass
    check_output_shapes(config, {"score": (2, 1)}, batch_size=2)
    check_output_shapes(config, {"score": (2,)}, batch_size=2)
