"""Tests for builds.verification: sample inputs run through the real models in onnxruntime, shape checks."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from builds.inspection import ModelSignature, TensorSpec, inspect_onnx
from builds.model_config import BuildOptions, build_model_config
from builds.verification import (
    SampleLimits,
    UserSamples,
    VerificationError,
    check_output_shapes,
    check_sample_archive,
    compare_joined_outputs,
    describe_sample_arrays,
    describe_sample_inputs,
    join_samples,
    make_sample_inputs,
    parse_sample_values,
    read_sample_arrays,
)
from conch.errors import InvalidInput, PayloadTooLarge
from tests import real_models
from tests.npz_bombs import lying_npz, npz_bomb
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
    # ocr_cls batches (a batch of one); ocr_det does not, so its dynamic axis 0 is sized too
    assert make_sample_inputs(config_for(real_models.ocr_cls), dynamic_size=96)["x"].shape == (1, 3, 96, 96)
    assert make_sample_inputs(config_for(real_models.ocr_det), dynamic_size=96)["x"].shape == (96, 3, 96, 96)


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
        (real_models.ocr_det, {"sigmoid_0.tmp_0": (64, 1, 64, 64)}),
        (real_models.ocr_cls, {"save_infer_model/scale_0.tmp_1": (1, 2)}),
        (real_models.ocr_rec, {"softmax_11.tmp_0": (64, 8, 6625)}),
        (real_models.magika, {"target_label": (64, 214)}),
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


# --- user samples ---------------------------------------------------------------------------------------------


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def silero_like() -> tuple[ModelConfig, ModelSignature]:
    """silero-vad's interface: input [-1, -1], state [2, -1, 128], a scalar INT64 sr; built without batching."""
    signature = ModelSignature(
        inputs=(
            TensorSpec("input", "FP32", (-1, -1), (None, None)),
            TensorSpec("state", "FP32", (2, -1, 128), (None, None, None)),
            TensorSpec("sr", "INT64", (), ()),
        ),
        outputs=(TensorSpec("output", "FP32", (-1, 1), (None, None)),),
        ir_version=8,
        opset=16,
        opset_imports=(("", 16),),
    )
    return build_model_config(name="vad", signature=signature, options=BuildOptions()), signature


LIMITS = SampleLimits(max_unpacked_bytes=1024 * 1024, max_arrays=4)


def test_read_sample_arrays_reads_named_arrays():
    arrays = read_sample_arrays(npz_bytes(input=np.zeros((1, 512), np.float32), sr=np.array(16000)), limits=LIMITS)
    assert sorted(arrays) == ["input", "sr"]
    assert (arrays["input"].shape, arrays["input"].dtype) == ((1, 512), np.float32)
    assert describe_sample_arrays(arrays) == {
        "input": {"dtype": "float32", "shape": [1, 512]},
        "sr": {"dtype": "int64", "shape": []},
    }


def _zip_bytes(members: dict[str, bytes]) -> bytes:
    """A zip archive (what schemathesis sent as sample inputs) whose members are not .npy arrays."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "The sample inputs file is empty."),
        (b"not an archive at all", "The sample inputs file is not a numpy .npz archive"),
        (lambda: np.save(buf := io.BytesIO(), np.zeros(3)) or buf.getvalue(), "holds a single .npy array"),
        (lambda: npz_bytes(), "holds no arrays"),
        (lambda: npz_bytes(x=np.array([{"a": 1}], dtype=object)), "object arrays and pickled data are not accepted"),
        (lambda: _zip_bytes({"a.txt": b"a"}), "holds 'a.txt', which is not a .npy array"),
    ],
    ids=["empty", "not-npz", "npy", "no-arrays", "pickle", "zip-of-text"],
)
def test_read_sample_arrays_refuses_bad_files_naming_the_field(data, message):
    with pytest.raises(InvalidInput) as caught:
        read_sample_arrays(data() if callable(data) else data, limits=LIMITS)
    assert caught.value.field == "sample_inputs"
    assert message in caught.value.detail


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("sr=16000", {"sr": 16000}),
        (" sr = 16000 ;threshold=0.5\nlang=en", {"sr": 16000, "threshold": 0.5, "lang": "en"}),
        ("ids=[[1, 2], [3, 4]], mask=true", {"ids": [[1, 2], [3, 4]], "mask": True}),
        ('text="a, b"', {"text": "a, b"}),
        ({"sr": 8000}, {"sr": 8000}),
        ("", {}),
        (None, {}),
    ],
)
def test_parse_sample_values_reads_text_and_json(raw, expected):
    assert parse_sample_values(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("16000", "sample_values entry '16000' is not of the form name=value"),
        ("sr=1; sr=2", "sample_values gives input 'sr' more than once"),
        ({"sr": {"a": 1}}, "sample_values gives input 'sr' the value {'a': 1}"),
        ({"sr": []}, "sample_values gives input 'sr' the value []"),
        (42, "sample_values must be text such as 'sr=16000' or a JSON object"),
    ],
)
def test_parse_sample_values_refuses_malformed_entries(raw, message):
    with pytest.raises(InvalidInput) as caught:
        parse_sample_values(raw)
    assert caught.value.field == "sample_values"
    assert caught.value.detail.startswith(message)


def test_make_sample_inputs_uses_user_arrays_and_values_for_silero_like_inputs():
    # given silero-vad's interface and the samples a user sends: arrays for input and state, sr as a value
    config, signature = silero_like()
    samples = UserSamples(
        arrays={"input": np.full((1, 512), 0.25, np.float64), "state": np.zeros((2, 1, 128), np.float32)},
        values={"sr": 16000},
    )

    # when
    inputs = make_sample_inputs(config, signature=signature, samples=samples)

    # then they are used as given, converted to the model's types, and the scalar travels as dims [1]
    assert [(name, a.dtype, a.shape) for name, a in inputs.items()] == [
        ("input", np.float32, (1, 512)),
        ("state", np.float32, (2, 1, 128)),
        ("sr", np.int64, (1,)),
    ]
    assert inputs["sr"].tolist() == [16000]
    assert np.all(inputs["input"] == 0.25)
    assert describe_sample_inputs(inputs, samples) == [
        "input float32 [1, 512] (sample_inputs)",
        "state float32 [2, 1, 128] (sample_inputs)",
        "sr int64 [1] (sample_values)",
    ]


def test_make_sample_inputs_without_samples_describes_what_it_generated():
    config, signature = silero_like()
    inputs = make_sample_inputs(config, signature=signature)
    assert describe_sample_inputs(inputs) == [
        "input float32 [64, 64] (generated: random floats in [0, 1))",
        "state float32 [2, 64, 128] (generated: random floats in [0, 1))",
        "sr int64 [1] (generated: all 1)",
    ]


def test_make_sample_inputs_fills_a_shaped_input_with_a_single_value():
    config, signature = silero_like()
    inputs = make_sample_inputs(config, signature=signature, samples=UserSamples(values={"state": 0}))
    assert inputs["state"].shape == (2, 64, 128) and not inputs["state"].any()


def test_make_sample_inputs_sizes_named_axes_like_the_user_array():
    # given MiniLM (three inputs sharing the axis 'sequence') and only input_ids supplied, 12 tokens long
    signature = inspect_onnx(real_models.minilm())
    config = build_model_config(name="m", signature=signature, options=BuildOptions())
    samples = UserSamples(arrays={"input_ids": np.arange(24, dtype=np.int32).reshape(2, 12)})

    # when the first and the second sample are made
    first = make_sample_inputs(config, signature=signature, samples=samples, item=0)
    second = make_sample_inputs(config, signature=signature, samples=samples, item=1)

    # then each takes one item of the user's batch, and the generated inputs follow its sequence length
    assert first["input_ids"].tolist() == [list(range(12))]
    assert second["input_ids"].tolist() == [list(range(12, 24))]
    assert first["attention_mask"].shape == (1, 12) and first["attention_mask"].dtype == np.int64
    assert np.all(first["attention_mask"] == 1) and np.all(second["attention_mask"] == 0)


@pytest.mark.parametrize(
    ("samples", "field", "message"),
    [
        (
            UserSamples(arrays={"audio": np.zeros(3)}),
            "sample_inputs",
            "sample_inputs names 'audio', which the model does not take; its inputs are 'input', 'state', 'sr'.",
        ),
        (
            UserSamples(arrays={"state": np.zeros((3, 1, 128), np.float32)}),
            "sample_inputs",
            "sample_inputs gives input 'state' shape [3, 1, 128] (a different size on a fixed axis), but the model "
            "takes shape [2, any, 128]",
        ),
        (
            UserSamples(values={"sr": 16000.5}),
            "sample_values",
            "sample_values gives input 'sr' float64 values, but the model takes INT64; give it whole numbers.",
        ),
        (
            UserSamples(values={"sr": "16k"}),
            "sample_values",
            "sample_values gives input 'sr' the text '16k', but the model takes INT64; give it whole numbers.",
        ),
        (
            UserSamples(arrays={"input": np.zeros(4, np.float32)}),
            "sample_inputs",
            "sample_inputs gives input 'input' shape [4] (1 axes), but the model takes shape [any, any]",
        ),
    ],
    ids=["unknown-name", "fixed-axis", "float-for-int", "text-for-int", "rank"],
)
def test_make_sample_inputs_refuses_samples_that_do_not_fit_the_model(samples, field, message):
    config, signature = silero_like()
    with pytest.raises(InvalidInput) as caught:
        make_sample_inputs(config, signature=signature, samples=samples)
    assert caught.value.field == field
    assert caught.value.detail.startswith(message)


# --- the batching proof ---------------------------------------------------------------------------------------


def test_the_classifier_gives_each_joined_sample_its_own_outputs():
    # given two different samples of the classifier, alone and joined on axis 0
    config = config_for(real_models.classifier)
    first, second = make_sample_inputs(config), make_sample_inputs(config, item=1)
    assert not np.array_equal(first["x"], second["x"])
    session = onnxruntime.InferenceSession(str(real_models.classifier()), providers=["CPUExecutionProvider"])

    def run(inputs):
        return dict(zip(["fetch_name_0"], session.run(None, inputs), strict=True))

    # when / then the joined run agrees with the runs alone
    check = compare_joined_outputs(config, [run(first), run(second)], run(join_samples(first, second)))
    assert check.problem == ""
    assert check.max_difference < 1e-5


def test_compare_joined_outputs_names_the_output_a_softmax_over_axis_0_mixes():
    # given outputs of a softmax over axis 0: alone each row is 1.0, joined the rows share the mass
    config = config_from_pbtxt(
        'name: "m" max_batch_size: 8 input { name: "x" data_type: TYPE_FP32 dims: [3] } '
        'output { name: "probs" data_type: TYPE_FP32 dims: [3] }'
    )
    first = {"probs": np.ones((1, 3), np.float32)}
    joined = {"probs": np.array([[0.4, 0.5, 0.6], [0.6, 0.5, 0.4]], np.float32)}

    # when
    check = compare_joined_outputs(config, [first, {"probs": np.ones((1, 3), np.float32)}], joined)

    # then
    assert check.problem == (
        "output 'probs' of sample 1 differs: at index [0, 0] it is 0.4 in the joined run but 1 alone "
        "(largest difference 0.6, allowed 0.0001 + 1e-03 x |value|)"
    )


@pytest.mark.parametrize(
    ("alone", "joined", "problem"),
    [
        (
            [{"y": np.zeros((1, 6))}, {"y": np.zeros((1, 6))}],
            {"y": np.zeros((3, 6))},
            "output 'y' has 3 rows on axis 0 for the joined samples, but the samples alone gave 1 + 1, so axis 0 of "
            "this output is not the batch axis",
        ),
        (
            [{"y": np.array([[1, 2]])}, {"y": np.array([[3, 4]])}],
            {"y": np.array([[1, 2], [3, 5]])},
            "output 'y' of sample 2 differs: at index [0, 1] it is 5 in the joined run but 4 alone",
        ),
        (
            [{"y": np.zeros((1, 2))}, {"y": np.zeros((1, 3))}],
            {"y": np.zeros((2, 2))},
            "output 'y' of sample 2 has shape [1, 2] in the joined run but [1, 3] alone",
        ),
        ([{}, {}], {}, "output 'y' did not come back from every run"),
    ],
    ids=["rows", "exact-ints", "shape", "missing"],
)
def test_compare_joined_outputs_reports_each_kind_of_difference(alone, joined, problem):
    config = config_from_pbtxt(
        'name: "m" max_batch_size: 8 input { name: "x" data_type: TYPE_FP32 dims: [3] } '
        'output { name: "y" data_type: TYPE_FP32 dims: [-1] }'
    )
    assert compare_joined_outputs(config, alone, joined).problem == problem


def test_compare_joined_outputs_tolerates_reordered_float_sums_and_matching_nans():
    config = config_from_pbtxt(
        'name: "m" max_batch_size: 8 input { name: "x" data_type: TYPE_FP32 dims: [1] } '
        'output { name: "y" data_type: TYPE_FP32 dims: [2] }'
    )
    alone = [{"y": np.array([[100.0, np.nan]], np.float32)}, {"y": np.array([[1.0, np.inf]], np.float32)}]
    joined = {"y": np.array([[100.00001, np.nan], [1.000001, np.inf]], np.float32)}
    check = compare_joined_outputs(config, alone, joined)
    assert check.problem == ""
    assert 0 < check.max_difference < 1e-4


# --- limits of an unpacked .npz (issue 19: a 1.2 MB file that unpacked to 1.2 GB) ------------------------------


def _peak_traced_bytes(call: Callable[[], object]) -> tuple[object, int]:
    """Run `call` under tracemalloc (numpy's array buffers are traced too) and return what it raised and the peak."""
    import tracemalloc

    tracemalloc.start()
    try:
        try:
            outcome: object = call()
        except Exception as error:  # the refusal is the outcome under test
            outcome = error
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return outcome, peak


@pytest.mark.parametrize("reader", [read_sample_arrays, check_sample_archive], ids=["worker", "web"])
def test_a_compressed_bomb_is_refused_with_413_before_it_is_unpacked(reader):
    # given 64 MiB of zeros packed into about 64 KB, and a limit of 1 MiB unpacked
    bomb = npz_bomb(name="x", shape=(16, 1024, 1024), dtype=np.float32)
    assert len(bomb) < 256 * 1024
    # when it is read
    outcome, peak = _peak_traced_bytes(lambda: reader(bomb, limits=LIMITS))
    # then 413 naming the limit, its setting and the array, and nothing near its size was ever held
    assert isinstance(outcome, PayloadTooLarge), outcome
    assert outcome.status_code == 413 and outcome.field == "sample_inputs"
    assert outcome.detail.startswith("The sample inputs file unpacks to 67,108,992 bytes")
    assert "'x' alone is 67,108,992" in outcome.detail
    assert "at most 1,048,576 are accepted (CONCH_MAX_SAMPLE_UNPACKED_BYTES)" in outcome.detail
    assert peak < 4 * 1024 * 1024


@pytest.mark.parametrize("reader", [read_sample_arrays, check_sample_archive], ids=["worker", "web"])
def test_an_array_header_declaring_gigabytes_is_refused_without_allocating_it(reader):
    # given a member whose archive entry says 112 bytes but whose .npy header declares float32 [100000, 100000]
    # (40 GB): a reader that trusted the header would allocate the array before reading it
    data = lying_npz(name="x", header_shape=(100_000, 100_000), data=b"\0" * 32)
    # when it is read
    outcome, peak = _peak_traced_bytes(lambda: reader(data, limits=LIMITS))
    # then 413 from the header alone
    assert isinstance(outcome, PayloadTooLarge), outcome
    assert outcome.detail.startswith(
        "Array 'x' of the sample inputs file is float32 [100000, 100000], 40,000,000,000 bytes unpacked"
    )
    assert "at most 1,048,576 are accepted (CONCH_MAX_SAMPLE_UNPACKED_BYTES)" in outcome.detail
    assert peak < 1024 * 1024


@pytest.mark.parametrize(
    ("reader", "expected"),
    [
        (lambda data: read_sample_arrays(data, limits=LIMITS)["x"].tolist(), [0.0, 0.0, 0.0, 0.0]),
        (lambda data: check_sample_archive(data, limits=LIMITS), {"x": {"dtype": "float32", "shape": [4]}}),
    ],
    ids=["worker", "web"],
)
def test_a_member_whose_stream_holds_more_than_its_entry_declares_is_read_only_to_its_declared_size(reader, expected):
    # given a member whose entry (size, CRC-32) and header declare float32 [4], but whose packed stream goes on with
    # 64 MiB of zeros
    data = lying_npz(name="x", header_shape=(4,), data=b"\0" * 16, stream_extra=64 * 1024 * 1024)
    # when it is read
    outcome, peak = _peak_traced_bytes(lambda: reader(data))
    # then only the declared bytes were unpacked: the rest of the stream never was
    assert outcome == expected
    assert peak < 4 * 1024 * 1024


@pytest.mark.parametrize("reader", [read_sample_arrays, check_sample_archive], ids=["worker", "web"])
def test_a_member_whose_data_does_not_match_its_header_is_refused(reader):
    # given a header that declares float32 [4] (16 bytes) over 32 bytes of data (which the entry declares)
    data = lying_npz(name="x", header_shape=(4,), data=b"\0" * 32)
    with pytest.raises(InvalidInput) as caught:
        reader(data, limits=LIMITS)
    assert caught.value.detail.startswith(
        "Array 'x' of the sample inputs file cannot be read (its header declares [4] float32 (16 bytes) but the "
        "archive declares 32 bytes of data)"
    )


@pytest.mark.parametrize("reader", [read_sample_arrays, check_sample_archive], ids=["worker", "web"])
def test_a_file_with_too_many_arrays_is_refused_with_413_naming_the_limit(reader):
    data = npz_bytes(**{f"a{i}": np.zeros(1, np.float32) for i in range(5)})
    with pytest.raises(PayloadTooLarge) as caught:
        reader(data, limits=LIMITS)
    assert caught.value.field == "sample_inputs"
    assert caught.value.detail == (
        "The sample inputs file holds 5 arrays; at most 4 are accepted (CONCH_MAX_SAMPLE_ARRAYS). Send one array per "
        "model input."
    )


def _with_damaged_data(data: bytes, array: np.ndarray) -> bytes:
    """`data` (an uncompressed `.npz` holding `array`) with one byte of the array's data flipped: directory,
    sizes and header unchanged, the member's CRC-32 no longer matches."""
    start = data.index(array.tobytes())
    damaged = bytearray(data)
    damaged[start + array.nbytes // 2] ^= 0xFF
    return bytes(damaged)


def test_the_web_check_unpacks_no_array_and_the_worker_finds_damaged_data():
    # given an .npz whose array data was damaged after it was written (its CRC-32 no longer matches), far enough
    # past the header that reading the header does not reach it (zipfile reads a small member whole, in 4 KiB)
    array = np.arange(8192, dtype=np.float32)
    data = _with_damaged_data(npz_bytes(x=array), array)
    # when the web process checks it: directory and header only, so it is described, not unpacked
    assert check_sample_archive(data, limits=LIMITS) == {"x": {"dtype": "float32", "shape": [8192]}}
    # then the worker, which reads the arrays, refuses it naming the field and the array
    with pytest.raises(InvalidInput) as caught:
        read_sample_arrays(data, limits=LIMITS)
    assert caught.value.field == "sample_inputs"
    assert caught.value.detail.startswith("Array 'x' of the sample inputs file cannot be read (Bad CRC-32")


def test_arrays_within_the_limits_are_read_and_described_alike():
    # given arrays up to the limit together, one of them Fortran-ordered, one compressed, one text
    image = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, image=image, words=np.array(["ab", "c"]), big=np.zeros(250_000, np.float32))
    data = buffer.getvalue()
    # when read by the worker and checked by the web process
    arrays = read_sample_arrays(data, limits=LIMITS)
    described = check_sample_archive(data, limits=LIMITS)
    # then the values are numpy's own, and both describe them the same way
    assert np.array_equal(arrays["image"], image) and arrays["image"].flags.f_contiguous
    assert arrays["words"].tolist() == ["ab", "c"]
    assert (
        described
        == describe_sample_arrays(arrays)
        == {
            "image": {"dtype": "float32", "shape": [2, 3, 4]},
            "words": {"dtype": "<U2", "shape": [2]},
            "big": {"dtype": "float32", "shape": [250000]},
        }
    )
