"""Tests for builds.model_config: configs for the real models, option parsing, overrides, serialisation."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from builds.inspection import ModelSignature, TensorSpec, inspect_onnx
from builds.model_config import (
    MAX_INSTANCE_COUNT,
    MAX_MAX_BATCH_SIZE,
    MAX_QUEUE_DELAY_MICROSECONDS,
    BuildOptions,
    apply_deployment_overrides,
    build_model_config,
    instance_kind_of,
    parse_build_options,
    read_batch_axis,
    supports_batching,
    validate_build_options,
    without_batching,
)
from conch.errors import InvalidInput
from models_registry.naming import validate_model_name
from tests import real_models
from tritonserving.config import ModelConfig, config_from_pbtxt, config_to_json, config_to_pbtxt

KIND_AUTO = model_config_pb2.ModelInstanceGroup.KIND_AUTO


@pytest.fixture(scope="module")
def classifier_signature() -> ModelSignature:
    return inspect_onnx(real_models.classifier())


@pytest.fixture(scope="module")
def ddddocr_signature() -> ModelSignature:
    return inspect_onnx(real_models.ddddocr_common())


def io_summary(tensors) -> list[tuple[str, str, list[int], list[int] | None]]:
    """(name, data type name, dims, reshape shape or None) for each config tensor."""
    return [
        (
            tensor.name,
            model_config_pb2.DataType.Name(tensor.data_type),
            list(tensor.dims),
            list(tensor.reshape.shape) if tensor.HasField("reshape") else None,
        )
        for tensor in tensors
    ]


def signature_of(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> ModelSignature:
    return ModelSignature(
        inputs=tuple(inputs), outputs=tuple(outputs), ir_version=8, opset=17, opset_imports=(("", 17),)
    )


def spec(name: str, datatype: str, dims: tuple[int, ...], names: tuple[str | None, ...] | None = None) -> TensorSpec:
    return TensorSpec(name=name, datatype=datatype, dims=dims, dim_names=names or (None,) * len(dims))


# --- the generated configs -----------------------------------------------------------------------------------


def test_build_model_config_for_the_classifier_is_exact(classifier_signature):
    # given the demo classifier and no options
    # when its configuration is built and written as config.pbtxt
    text = config_to_pbtxt(
        build_model_config(name="rapid-orientation", signature=classifier_signature, options=BuildOptions())
    )

    # then the text parses back into exactly this configuration
    parsed = config_from_pbtxt(text)
    assert parsed.name == "rapid-orientation"
    assert parsed.backend == "onnxruntime"
    assert parsed.platform == ""
    assert parsed.default_model_filename == "model.onnx"
    assert parsed.max_batch_size == 8
    assert io_summary(parsed.input) == [("x", "TYPE_FP32", [3, 224, 224], None)]
    assert io_summary(parsed.output) == [("fetch_name_0", "TYPE_FP32", [4], None)]
    assert parsed.HasField("dynamic_batching")
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(parsed.dynamic_batching.preferred_batch_size) == []
    assert [(group.kind, group.count, list(group.gpus)) for group in parsed.instance_group] == [(KIND_AUTO, 1, [])]
    assert text == (
        'name: "rapid-orientation"\n'
        "max_batch_size: 8\n"
        "input {\n"
        '  name: "x"\n'
        "  data_type: TYPE_FP32\n"
        "  dims: 3\n"
        "  dims: 224\n"
        "  dims: 224\n"
        "}\n"
        "output {\n"
        '  name: "fetch_name_0"\n'
        "  data_type: TYPE_FP32\n"
        "  dims: 4\n"
        "}\n"
        "instance_group {\n"
        "  count: 1\n"
        "}\n"
        'default_model_filename: "model.onnx"\n'
        "dynamic_batching {\n"
        "  max_queue_delay_microseconds: 100\n"
        "}\n"
        'backend: "onnxruntime"\n'
    )


def test_build_model_config_for_ddddocr_serves_without_batching(ddddocr_signature):
    # given ddddocr, whose batch axis is fixed at 1
    # when its configuration is built with no options
    config = build_model_config(name="ddddocr", signature=ddddocr_signature, options=BuildOptions())

    # then max_batch_size is 0, dims are the full shapes and there is no dynamic batcher
    assert config.max_batch_size == 0
    assert io_summary(config.input) == [("input1", "TYPE_FP32", [1, 1, 64, -1], None)]
    assert io_summary(config.output) == [("387", "TYPE_FP32", [1, -1], None)]
    assert not config.HasField("dynamic_batching")
    assert config_to_pbtxt(config) == (
        'name: "ddddocr"\n'
        "input {\n"
        '  name: "input1"\n'
        "  data_type: TYPE_FP32\n"
        "  dims: 1\n"
        "  dims: 1\n"
        "  dims: 64\n"
        "  dims: -1\n"
        "}\n"
        "output {\n"
        '  name: "387"\n'
        "  data_type: TYPE_FP32\n"
        "  dims: 1\n"
        "  dims: -1\n"
        "}\n"
        "instance_group {\n"
        "  count: 1\n"
        "}\n"
        'default_model_filename: "model.onnx"\n'
        'backend: "onnxruntime"\n'
    )


def test_build_model_config_for_the_text_embedder_keeps_the_sequence_axis_dynamic():
    # given MiniLM: three INT64 [batch, sequence] inputs
    signature = inspect_onnx(real_models.minilm())

    # when
    config = build_model_config(name="minilm", signature=signature, options=BuildOptions())

    # then the batch axis leaves dims and the sequence axis stays -1
    assert config.max_batch_size == 8
    assert io_summary(config.input) == [
        ("input_ids", "TYPE_INT64", [-1], None),
        ("attention_mask", "TYPE_INT64", [-1], None),
        ("token_type_ids", "TYPE_INT64", [-1], None),
    ]
    assert io_summary(config.output) == [("last_hidden_state", "TYPE_FP32", [-1, 384], None)]


@pytest.mark.parametrize(
    ("model", "max_batch_size", "inputs", "outputs"),
    [
        # axis 0 unnamed on both tensors: the batch axis
        (
            real_models.ocr_cls,
            8,
            [("x", "TYPE_FP32", [3, -1, -1], None)],
            [("save_infer_model/scale_0.tmp_1", "TYPE_FP32", [2], None)],
        ),
        # the exporter gave axis 0 of the input and of the output different symbols: not shown to be one batch axis
        (
            real_models.ocr_det,
            0,
            [("x", "TYPE_FP32", [-1, 3, -1, -1], None)],
            [("sigmoid_0.tmp_0", "TYPE_FP32", [-1, 1, -1, -1], None)],
        ),
        (
            real_models.ocr_rec,
            0,
            [("x", "TYPE_FP32", [-1, 3, -1, -1], None)],
            [("softmax_11.tmp_0", "TYPE_FP32", [-1, -1, 6625], None)],
        ),
        (
            real_models.magika,
            0,
            [("bytes", "TYPE_INT32", [-1, 2048], None)],
            [("target_label", "TYPE_FP32", [-1, 214], None)],
        ),
    ],
)
def test_build_model_config_for_the_other_real_models(model, max_batch_size, inputs, outputs):
    # given a real model with a dynamic axis 0
    signature = inspect_onnx(model())

    # when
    config = build_model_config(name="m", signature=signature, options=BuildOptions())

    # then it batches only when the axis names show axis 0 is one batch axis
    assert config.max_batch_size == max_batch_size
    assert config.HasField("dynamic_batching") == (max_batch_size > 0)
    assert io_summary(config.input) == inputs
    assert io_summary(config.output) == outputs


def test_build_model_config_batches_a_model_with_differing_axis_names_when_asked():
    # given magika, whose input and output name axis 0 'unk__214' and 'unk__215'
    signature = inspect_onnx(real_models.magika())

    # when max_batch_size is asked for explicitly (the verify step then proves batching safe)
    config = build_model_config(name="m", signature=signature, options=BuildOptions(max_batch_size=8))

    # then the model batches
    assert config.max_batch_size == 8
    assert io_summary(config.input) == [("bytes", "TYPE_INT32", [2048], None)]


def test_build_model_config_applies_every_option(classifier_signature):
    # given options parsed from form fields
    options = parse_build_options(
        {
            "max_batch_size": "16",
            "max_queue_delay_microseconds": "500",
            "preferred_batch_size": "8, 4",
            "instance_count": "2",
        }
    )

    # when
    config = build_model_config(name="clf", signature=classifier_signature, options=options)

    # then
    assert config.max_batch_size == 16
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert [(group.kind, group.count) for group in config.instance_group] == [(KIND_AUTO, 2)]


def test_build_model_config_uses_dims_one_and_empty_reshape_for_a_batch_only_tensor():
    # given a batchable model with a [batch] input and a [batch, 3] output
    signature = signature_of([spec("ids", "INT64", (-1,))], [spec("scores", "FP32", (-1, 3))])

    # when
    config = build_model_config(name="m", signature=signature, options=BuildOptions())

    # then the [batch] tensor is dims [1] with an empty reshape (Triton "Reshape")
    assert io_summary(config.input) == [("ids", "TYPE_INT64", [1], [])]
    assert io_summary(config.output) == [("scores", "TYPE_FP32", [3], None)]


def test_build_model_config_uses_dims_one_without_reshape_for_a_scalar():
    # given a model with a scalar input, which cannot batch
    signature = signature_of([spec("t", "FP32", ())], [spec("y", "BYTES", (2,))])

    # when
    config = build_model_config(name="m", signature=signature, options=BuildOptions())

    # then
    assert config.max_batch_size == 0
    assert io_summary(config.input) == [("t", "TYPE_FP32", [1], None)]
    assert io_summary(config.output) == [("y", "TYPE_STRING", [2], None)]


def test_supports_batching_needs_a_dynamic_axis_zero_everywhere(classifier_signature, ddddocr_signature):
    assert supports_batching(classifier_signature) is True
    assert supports_batching(ddddocr_signature) is False


@pytest.mark.parametrize(
    ("inputs", "outputs", "reasons"),
    [
        (
            # a time-major RNN: [seq, batch, feat] in and out; axis 0 is the same symbol, but it is the sequence
            [spec("x", "FP32", (-1, -1, 2), ("seq", "batch", None))],
            [spec("y", "FP32", (-1, -1, 4), ("seq", "batch", None))],
            (
                "input 'x' names axis 1 'batch', so its batch axis is axis 1, not axis 0",
                "output 'y' names axis 1 'batch', so its batch axis is axis 1, not axis 0",
            ),
        ),
        (
            # a 1-D waveform in, per-frame features out
            [spec("audio", "FP32", (-1,), ("samples",))],
            [spec("features", "FP32", (-1, 40), ("frames", None))],
            (
                "axis 0 is not one symbol on every tensor (input 'audio' axis 0 'samples', output 'features' axis 0 "
                "'frames')",
            ),
        ),
        (
            # a detector: a batch of images in, a list of boxes out
            [spec("images", "FP32", (-1, 3, 640, 640), ("batch", None, None, None))],
            [spec("detections", "FP32", (-1, 6), ("num_boxes", None))],
            (
                "axis 0 is not one symbol on every tensor (input 'images' axis 0 'batch', output 'detections' axis 0 "
                "'num_boxes')",
            ),
        ),
        (
            [spec("x", "FP32", (-1, 4), ("batch", None))],
            [spec("y", "FP32", (-1, 2))],
            ("axis 0 is not one symbol on every tensor (input 'x' axis 0 'batch', output 'y' axis 0 unnamed)",),
        ),
    ],
    ids=["time-major-rnn", "waveform-to-frames", "detector", "named-and-unnamed"],
)
def test_a_dynamic_axis_0_that_is_not_one_batch_axis_builds_without_batching(inputs, outputs, reasons):
    # given a model whose axis 0 is dynamic everywhere but is not shown to be one batch axis
    signature = signature_of(inputs, outputs)

    # when
    reading = read_batch_axis(signature)
    config = build_model_config(name="m", signature=signature, options=BuildOptions())

    # then the reason names the tensors and the axis names, and the model is served without batching
    assert (reading.blockers, reading.doubts) == ((), reasons)
    assert reading.explain() == (
        "Triton batches along axis 0 only, and axis 0 is not the same dynamic batch axis on every input and output: "
        + "; ".join(reasons)
        + "."
    )
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in [*config.input, *config.output]] == [list(t.dims) for t in [*inputs, *outputs]]


def test_read_batch_axis_names_every_tensor_that_cannot_batch():
    signature = signature_of(
        [spec("input", "FP32", (-1, -1)), spec("state", "FP32", (2, -1, 128)), spec("sr", "INT64", ())],
        [spec("output", "FP32", (-1, 1))],
    )
    reading = read_batch_axis(signature)
    assert reading.blockers == (
        "input 'state' has axis 0 fixed at 2, shape [2, -1, 128]",
        "input 'sr' is a scalar (rank 0) with no batch axis",
    )
    assert reading.batchable is False


def test_read_batch_axis_accepts_one_symbol_or_none_on_axis_0(classifier_signature):
    assert read_batch_axis(classifier_signature).batchable
    assert read_batch_axis(inspect_onnx(real_models.minilm())).batchable
    assert read_batch_axis(signature_of([spec("x", "FP32", (-1, 3))], [spec("y", "FP32", (-1,))])).batchable


# --- batching rules ------------------------------------------------------------------------------------------


def test_build_model_config_refuses_batching_a_model_with_a_fixed_axis_zero(ddddocr_signature):
    # given ddddocr and a request for batching
    options = BuildOptions(max_batch_size=8)

    # when / then
    with pytest.raises(InvalidInput) as caught:
        build_model_config(name="ddddocr", signature=ddddocr_signature, options=options)
    assert caught.value.field == "max_batch_size"
    assert caught.value.detail == (
        "max_batch_size 8 needs axis 0 of every input and output to be dynamic, because Triton uses axis 0 as the "
        "batch axis, but input 'input1' has axis 0 fixed at 1, shape [1, 1, 64, -1]. Leave max_batch_size empty or set "
        "it to 0: the model is then served without Triton batching, one request per run. To batch, export the "
        "model with a dynamic first axis (e.g. dynamic_axes={'input': {0: 'batch'}} in torch.onnx.export)."
    )


def test_build_model_config_accepts_max_batch_size_zero_for_a_fixed_batch_model(ddddocr_signature):
    config = build_model_config(name="ddddocr", signature=ddddocr_signature, options=BuildOptions(max_batch_size=0))
    assert config.max_batch_size == 0


def test_build_model_config_accepts_max_batch_size_zero_for_a_batchable_model(classifier_signature):
    # given the classifier (dynamic axis 0) and max_batch_size 0: served as written, auto-complete is off
    config = build_model_config(name="clf", signature=classifier_signature, options=BuildOptions(max_batch_size=0))

    # then the full shapes are the dims and no batcher runs
    assert config.max_batch_size == 0
    assert io_summary(config.input) == [("x", "TYPE_FP32", [-1, 3, 224, 224], None)]
    assert io_summary(config.output) == [("fetch_name_0", "TYPE_FP32", [-1, 4], None)]
    assert not config.HasField("dynamic_batching")


def test_build_model_config_refuses_a_queue_delay_for_a_model_that_cannot_batch(ddddocr_signature):
    with pytest.raises(InvalidInput) as caught:
        build_model_config(
            name="ddddocr", signature=ddddocr_signature, options=BuildOptions(max_queue_delay_microseconds=100)
        )
    assert caught.value.field == "max_queue_delay_microseconds"
    assert caught.value.detail == (
        "max_queue_delay_microseconds only applies when Triton batches requests, but this model is built without "
        "batching (input 'input1' has axis 0 fixed at 1, shape [1, 1, 64, -1]; output '387' has axis 0 fixed at 1, "
        "shape [1, -1]), so a queue delay would have no effect. Leave max_queue_delay_microseconds empty."
    )


def test_build_model_config_refuses_preferred_sizes_above_the_default_max_batch_size(classifier_signature):
    with pytest.raises(InvalidInput) as caught:
        build_model_config(
            name="clf", signature=classifier_signature, options=BuildOptions(preferred_batch_size=(4, 16))
        )
    assert caught.value.field == "preferred_batch_size"
    assert caught.value.detail == (
        "preferred_batch_size 4, 16 includes sizes above max_batch_size 8; each preferred size must be between 1 and 8."
    )


def test_build_model_config_checks_the_name(classifier_signature):
    with pytest.raises(InvalidInput) as caught:
        build_model_config(name="Rapid_Orientation", signature=classifier_signature, options=BuildOptions())
    assert caught.value.field == "name"


# --- options -------------------------------------------------------------------------------------------------


def test_parse_build_options_reads_form_strings():
    # given form fields as strings, with spaces and extra keys
    fields = {
        "name": "clf",
        "max_batch_size": " 16 ",
        "max_queue_delay_microseconds": "250",
        "preferred_batch_size": "8 4,2",
        "instance_count": "3",
    }

    # when / then: preferred sizes come back sorted
    assert parse_build_options(fields) == BuildOptions(
        max_batch_size=16, max_queue_delay_microseconds=250, preferred_batch_size=(2, 4, 8), instance_count=3
    )


def test_parse_build_options_treats_blank_and_missing_fields_as_defaults():
    assert (
        parse_build_options({"max_batch_size": "", "preferred_batch_size": "  ", "instance_count": None})
        == BuildOptions()
    )


def test_parse_build_options_reads_json_values():
    assert parse_build_options({"max_batch_size": 4, "preferred_batch_size": [2, 4]}) == BuildOptions(
        max_batch_size=4, preferred_batch_size=(2, 4)
    )


@pytest.mark.parametrize(
    ("fields", "field", "detail"),
    [
        (
            {"max_batch_size": "-1"},
            "max_batch_size",
            "max_batch_size must be between 0 and 1024 (0 turns Triton batching off); got -1.",
        ),
        (
            {"max_batch_size": "8.5"},
            "max_batch_size",
            (
                "max_batch_size must be a whole number such as 8 (digits only, no decimals or units), or left empty; "
                "got '8.5'."
            ),
        ),
        (
            {"max_batch_size": "eight"},
            "max_batch_size",
            (
                "max_batch_size must be a whole number such as 8 (digits only, no decimals or units), or left empty; "
                "got 'eight'."
            ),
        ),
        (
            {"max_batch_size": "5000"},
            "max_batch_size",
            "max_batch_size must be between 0 and 1024 (0 turns Triton batching off); got 5000.",
        ),
        (
            {"max_queue_delay_microseconds": "5000000"},
            "max_queue_delay_microseconds",
            (
                "max_queue_delay_microseconds must be between 0 and 1000000 (microseconds, i.e. up to 1 second; it is "
                "how long Triton may hold a request to batch it with others); got 5000000."
            ),
        ),
        (
            {"max_queue_delay_microseconds": "-5"},
            "max_queue_delay_microseconds",
            (
                "max_queue_delay_microseconds must be between 0 and 1000000 (microseconds, i.e. up to 1 second; it is "
                "how long Triton may hold a request to batch it with others); got -5."
            ),
        ),
        (
            {"instance_count": "0"},
            "instance_count",
            "instance_count must be between 1 and 16 (model instances per group); got 0.",
        ),
        (
            {"instance_count": "100"},
            "instance_count",
            "instance_count must be between 1 and 16 (model instances per group); got 100.",
        ),
        (
            {"preferred_batch_size": "4, x"},
            "preferred_batch_size",
            (
                "preferred_batch_size must be a whole number such as 8 (digits only, no decimals or units), or left "
                "empty; got 'x'."
            ),
        ),
        (
            {"preferred_batch_size": "0"},
            "preferred_batch_size",
            "preferred_batch_size must be between 1 and 1024 (each size is a batch of requests); got 0.",
        ),
        (
            {"preferred_batch_size": "4,4"},
            "preferred_batch_size",
            "preferred_batch_size lists a size more than once (4, 4); list each size once.",
        ),
        (
            {"max_batch_size": "4", "preferred_batch_size": "8"},
            "preferred_batch_size",
            (
                "preferred_batch_size 8 includes sizes above max_batch_size 4; each preferred size must be between 1 "
                "and 4."
            ),
        ),
        (
            {"max_batch_size": "0", "max_queue_delay_microseconds": "100"},
            "max_queue_delay_microseconds",
            (
                "max_queue_delay_microseconds only applies when Triton batches requests, but max_batch_size is 0, so a "
                "queue delay would have no effect. Leave max_queue_delay_microseconds empty."
            ),
        ),
        (
            {"max_batch_size": "0", "preferred_batch_size": "1"},
            "preferred_batch_size",
            (
                "preferred_batch_size only applies when Triton batches requests, but max_batch_size is 0, so preferred "
                "batch sizes would have no effect. Leave preferred_batch_size empty."
            ),
        ),
        (
            {"max_batch_size": True},
            "max_batch_size",
            "max_batch_size must be a whole number such as 8; got True.",
        ),
    ],
)
def test_parse_build_options_rejects_meaningless_values(fields, field, detail):
    with pytest.raises(InvalidInput) as caught:
        parse_build_options(fields)
    assert caught.value.field == field
    assert caught.value.detail == detail


def test_parse_build_options_refuses_every_field_at_fault_at_once():
    # given three options wrong on their own (a word, a range, a spec) and a right one
    fields = {"max_batch_size": "eight", "instance_count": "0", "input_spec": "x:FP33[-1,3]", "tolerance": "0.01"}
    # when
    with pytest.raises(InvalidInput) as caught:
        parse_build_options(fields)
    # then the first is the error, and every one is among its refusals, in the form's order
    assert caught.value.field == "max_batch_size"
    assert [refusal.field for refusal in caught.value.refusals] == ["max_batch_size", "instance_count", "input_spec"]
    # and every range at once
    with pytest.raises(InvalidInput) as ranges:
        parse_build_options({"max_batch_size": "2000", "instance_count": "0", "max_queue_delay_microseconds": "-1"})
    assert [refusal.field for refusal in ranges.value.refusals] == [
        "max_batch_size",
        "max_queue_delay_microseconds",
        "instance_count",
    ]
    # and one field at fault is refused alone, as before
    with pytest.raises(InvalidInput) as alone:
        parse_build_options({"instance_count": "0"})
    assert alone.value.field == "instance_count" and alone.value.refusals == ()


def test_validate_build_options_rejects_a_non_integer_value():
    with pytest.raises(InvalidInput) as caught:
        validate_build_options(BuildOptions(instance_count="2"))
    assert caught.value.field == "instance_count"
    assert caught.value.detail == (
        "instance_count must be a whole number between 1 and 16 (model instances per group); got '2'."
    )


def test_build_options_to_dict_is_json_ready():
    options = BuildOptions(max_batch_size=4, preferred_batch_size=(2, 4))
    assert json.loads(json.dumps(options.to_dict())) == {
        "max_batch_size": 4,
        "max_queue_delay_microseconds": None,
        "preferred_batch_size": [2, 4],
        "instance_count": None,
    }


# --- names ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "rapid-orientation", "minilm-l6-v2", "0model", "a" * 63])
def test_validate_model_name_accepts_dns_labels(name):
    validate_model_name(name)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("Rapid_Orientation", " For example: 'rapid-orientation'."),
        ("-model", " For example: 'model'."),
        ("model-", " For example: 'model'."),
        ("my.model", " For example: 'my-model'."),
        ("a" * 64, " For example: '" + "a" * 63 + "'."),
        ("Résumé", " For example: 'resume'."),
        ("___", ""),
    ],
)
def test_validate_model_name_rejects_other_names_and_states_the_rule(name, hint):
    with pytest.raises(InvalidInput) as caught:
        validate_model_name(name)
    problem = "it is 64 characters long" if len(name) > 63 else "it does not fit"
    assert caught.value.field == "name"
    assert caught.value.detail == (
        f"{name!r} is not a valid model name ({problem}): a model name must be 1 to 63 characters of lowercase "
        "letters a-z, digits and hyphens, and start and end with a letter or digit (a DNS label, shared by Triton "
        f"repository folders and Kubernetes names).{hint}"
    )


def test_validate_model_name_requires_a_name():
    with pytest.raises(InvalidInput) as caught:
        validate_model_name("")
    assert caught.value.field == "name"
    assert caught.value.detail.startswith("A name is required: a model name must be 1 to 63 characters")


# --- deployment overrides ------------------------------------------------------------------------------------


def test_apply_deployment_overrides_changes_a_copy(classifier_signature):
    # given the classifier's built configuration
    built = build_model_config(name="clf", signature=classifier_signature, options=BuildOptions())

    # when a deployment asks for 3 instances, batches of 32 and a 2 ms queue delay
    deployed = apply_deployment_overrides(built, instance_count=3, max_batch_size=32, max_queue_delay_microseconds=2000)

    # then the copy has them and the built config is unchanged
    assert (deployed.max_batch_size, deployed.dynamic_batching.max_queue_delay_microseconds) == (32, 2000)
    assert [(group.kind, group.count) for group in deployed.instance_group] == [(KIND_AUTO, 3)]
    assert io_summary(deployed.input) == io_summary(built.input)
    assert (built.max_batch_size, built.instance_group[0].count) == (8, 1)
    assert built.dynamic_batching.max_queue_delay_microseconds == 100


def test_apply_deployment_overrides_sets_the_instance_kind_of_every_group(classifier_signature):
    # given the classifier's built configuration (one group, KIND_AUTO)
    built = build_model_config(name="clf", signature=classifier_signature, options=BuildOptions())
    assert instance_kind_of(built) == "KIND_AUTO"
    # when a deployment asks for CPU instances, then for GPU ones
    cpu = apply_deployment_overrides(built, instance_kind="KIND_CPU")
    gpu = apply_deployment_overrides(built, instance_count=2, instance_kind="KIND_GPU")
    # then the copies have that kind, the count as asked (or as built), and the built config is unchanged
    groups = model_config_pb2.ModelInstanceGroup
    assert [(group.kind, group.count) for group in cpu.instance_group] == [(groups.KIND_CPU, 1)]
    assert [(group.kind, group.count) for group in gpu.instance_group] == [(groups.KIND_GPU, 2)]
    kinds = (instance_kind_of(cpu), instance_kind_of(gpu), instance_kind_of(built))
    assert kinds == ("KIND_CPU", "KIND_GPU", "KIND_AUTO")
    assert "kind: KIND_CPU" in config_to_pbtxt(cpu)
    # and a kind not offered to deployments is refused, naming the field
    with pytest.raises(InvalidInput) as caught:
        apply_deployment_overrides(built, instance_kind="KIND_MODEL")
    assert caught.value.field == "instance_kind"
    assert caught.value.detail == "instance_kind must be one of KIND_AUTO, KIND_CPU, KIND_GPU; got 'KIND_MODEL'."


def test_apply_deployment_overrides_with_nothing_returns_an_equal_copy(ddddocr_signature):
    built = build_model_config(name="ddddocr", signature=ddddocr_signature, options=BuildOptions())
    deployed = apply_deployment_overrides(built)
    assert deployed == built
    assert deployed is not built


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_batch_size": 4}, "max_batch_size"),
        ({"max_queue_delay_microseconds": 100}, "max_queue_delay_microseconds"),
        ({"instance_count": 0}, "instance_count"),
        ({"max_batch_size": -2}, "max_batch_size"),
    ],
)
def test_apply_deployment_overrides_keeps_the_build_rules_for_a_fixed_batch_model(ddddocr_signature, overrides, field):
    built = build_model_config(name="ddddocr", signature=ddddocr_signature, options=BuildOptions())
    with pytest.raises(InvalidInput) as caught:
        apply_deployment_overrides(built, **overrides)
    assert caught.value.field == field


def test_apply_deployment_overrides_may_turn_batching_off(classifier_signature):
    built = build_model_config(name="clf", signature=classifier_signature, options=BuildOptions())
    deployed = apply_deployment_overrides(built, max_batch_size=0)
    assert deployed.max_batch_size == 0
    assert io_summary(deployed.input) == [("x", "TYPE_FP32", [-1, 3, 224, 224], None)]
    assert not deployed.HasField("dynamic_batching")


def test_without_batching_gives_full_shapes_and_no_batcher():
    # given a batching config with a [batch] tensor (dims [1], empty reshape)
    built = build_model_config(
        name="m",
        signature=signature_of([spec("ids", "INT64", (-1,)), spec("x", "FP32", (-1, 3))], [spec("y", "FP32", (-1, 2))]),
        options=BuildOptions(preferred_batch_size=(2, 4)),
    )
    assert io_summary(built.input)[0] == ("ids", "TYPE_INT64", [1], [])

    # when
    served = without_batching(built)

    # then every tensor has its full shape, the batcher is gone, and the built config is unchanged
    assert served.max_batch_size == 0
    assert io_summary(served.input) == [("ids", "TYPE_INT64", [-1], None), ("x", "TYPE_FP32", [-1, 3], None)]
    assert io_summary(served.output) == [("y", "TYPE_FP32", [-1, 2], None)]
    assert not served.HasField("dynamic_batching")
    assert built.max_batch_size == 8
    assert without_batching(served) == served


def test_apply_deployment_overrides_keeps_preferred_sizes_within_max_batch_size(classifier_signature):
    # given a config built with preferred sizes 4 and 8
    built = build_model_config(
        name="clf", signature=classifier_signature, options=BuildOptions(preferred_batch_size=(4, 8))
    )

    # when / then lowering max_batch_size below 8 is refused
    with pytest.raises(InvalidInput) as caught:
        apply_deployment_overrides(built, max_batch_size=4)
    assert caught.value.field == "max_batch_size"
    assert caught.value.detail == (
        "max_batch_size 4 is smaller than the preferred batch sizes this model was built with (4, 8); choose at "
        "least 8, or rebuild the model with smaller preferred sizes."
    )


def test_apply_deployment_overrides_refuses_turning_batching_on_for_a_config_built_without_it():
    # given a config built without batching whose tensors all have a dynamic axis 0 (batching was not proven)
    built = config_from_pbtxt(
        'name: "m" backend: "onnxruntime" '
        'input { name: "x" data_type: TYPE_FP32 dims: [-1, 3] } '
        'output { name: "y" data_type: TYPE_FP32 dims: [-1, 2] }'
    )

    # when / then batching cannot be switched on at deployment time
    with pytest.raises(InvalidInput) as caught:
        apply_deployment_overrides(built, max_batch_size=4)
    assert caught.value.field == "max_batch_size"
    assert caught.value.detail.startswith(
        "max_batch_size 4 cannot be used: this model version was built without batching"
    )


@pytest.mark.parametrize(
    ("option", "value", "bound"),
    [
        ("instance_count", MAX_INSTANCE_COUNT + 1, f"between 1 and {MAX_INSTANCE_COUNT}"),
        ("max_batch_size", MAX_MAX_BATCH_SIZE + 1, f"between 0 and {MAX_MAX_BATCH_SIZE}"),
        (
            "max_queue_delay_microseconds",
            MAX_QUEUE_DELAY_MICROSECONDS + 1,
            f"between 0 and {MAX_QUEUE_DELAY_MICROSECONDS}",
        ),
    ],
)
def test_apply_deployment_overrides_uses_the_build_bounds(classifier_signature, option, value, bound):
    built = build_model_config(name="clf", signature=classifier_signature, options=BuildOptions())
    with pytest.raises(InvalidInput) as caught:
        apply_deployment_overrides(built, **{option: value})
    assert caught.value.field == option
    assert bound in caught.value.detail


# --- serialisation -------------------------------------------------------------------------------------------


def test_config_to_json_is_what_the_repository_load_api_takes(classifier_signature):
    # given the classifier's configuration
    config = build_model_config(name="rapid-orientation", signature=classifier_signature, options=BuildOptions())

    # when it is rendered as JSON
    text = config_to_json(config)

    # then it uses proto field names and plain numbers, and parses back to the same message
    assert json.loads(text) == {
        "name": "rapid-orientation",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}],
        "output": [{"name": "fetch_name_0", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"count": 1}],
        "default_model_filename": "model.onnx",
        "dynamic_batching": {"max_queue_delay_microseconds": 100},
    }
    assert json_format.Parse(text, ModelConfig()) == config


def test_config_to_json_writes_an_empty_reshape():
    signature = signature_of([spec("ids", "INT64", (-1,))], [spec("y", "FP32", (-1, 2))])
    config = build_model_config(name="m", signature=signature, options=BuildOptions())
    assert json.loads(config_to_json(config))["input"] == [
        {"name": "ids", "data_type": "TYPE_INT64", "dims": [1], "reshape": {}}
    ]


def test_config_pbtxt_round_trips(ddddocr_signature):
    config = build_model_config(name="ddddocr", signature=ddddocr_signature, options=BuildOptions(instance_count=2))
    assert config_from_pbtxt(config_to_pbtxt(config)) == config


def test_config_from_pbtxt_rejects_invalid_text():
    with pytest.raises(InvalidInput) as caught:
        config_from_pbtxt('name: "m"\nmax_batch_sise: 4\n')
    assert caught.value.field == "config"
    assert caught.value.detail.startswith("This is not a valid Triton model configuration: 2:1 :")
    assert "max_batch_sise" in caught.value.detail


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("x, keep_prob", ("x", "keep_prob")),
        ("logits:0 model/dense/BiasAdd", ("logits", "model/dense/BiasAdd")),
        (["a", "b"], ("a", "b")),
        ("", None),
        (None, None),
    ],
)
def test_graph_node_options_take_names_separated_by_commas_or_spaces(raw, parsed):
    from builds.model_config import parse_build_options

    assert parse_build_options({"graph_outputs": raw}).graph_outputs == parsed
    options = parse_build_options({"graph_inputs": raw})
    assert options.graph_inputs == parsed
    assert ("graph_inputs" in options.to_dict()) is (parsed is not None)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("x, _hidden", "graph_inputs: '_hidden' is not a TensorFlow node name"),
        ("x x", "graph_inputs names 'x' twice"),
        (",".join(f"n{i}" for i in range(65)), "graph_inputs names 65 nodes; at most 64"),
        (7, "graph_inputs must be node names separated by commas"),
    ],
)
def test_graph_node_options_refuse_what_is_no_node_name(raw, says):
    from builds.model_config import parse_build_options

    with pytest.raises(InvalidInput) as raised:
        parse_build_options({"graph_inputs": raw})
    assert raised.value.field == "graph_inputs" and raised.value.detail.startswith(says)
