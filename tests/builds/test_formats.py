"""Which files Conch builds, told from their name and first bytes together (`builds.formats`): pure checks."""

from __future__ import annotations

import pytest

from builds.formats import (
    FORMATS,
    HEAD_BYTES,
    archive_kind,
    check_model_filename,
    check_model_head,
    describe_formats,
    detect_format,
)
from conch.errors import InvalidInput
from devtools.tree_models import lightgbm_model, xgboost_model
from tests import real_models


@pytest.mark.parametrize(
    "name",
    [
        "model.onnx",
        "MODEL.ONNX",
        "rapid.v2.onnx",
        "model",
        "dir/model.onnx",
        "model.txt",
        "m.json",
        "m.UBJ",
        "x.lgb",
        "model.zip",
        "m.tar.gz",
        "m.TGZ",
        "m.tar.xz",
        "m.tar",
        "m.keras",
        "m.h5",
        "frozen.pb",
        "m.tflite",
    ],
)
def test_names_of_formats_conch_builds_and_names_without_an_ending_pass(name):
    check_model_filename(name, field="filename")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("model.ckpt", "a training checkpoint (PyTorch Lightning, TensorFlow)"),
        ("pytorch_model.bin", "a weights file"),
        ("notes.docx", "rename it to the format's ending"),
        ("model.onnx.gz", "a compressed file; Conch unpacks .zip, .tar, .tar.gz"),
        ("model.7z", "pack the model's files as a .zip or .tar.gz"),
    ],
)
def test_other_endings_are_refused_naming_the_field_and_what_conch_builds(name, says):
    with pytest.raises(InvalidInput) as raised:
        check_model_filename(name, field="filename")
    assert raised.value.field == "filename"
    assert raised.value.detail.startswith(f"{name!r} is not a model file Conch builds: Conch builds ONNX model (.onnx)")
    assert "LightGBM model (text) (.txt, .model, .lgb); XGBoost model (JSON or UBJSON) (.json, .ubj)" in (
        raised.value.detail
    )
    assert says in raised.value.detail


def test_the_first_bytes_of_real_onnx_models_pass():
    for path in (real_models.classifier(), real_models.magika()):
        assert check_model_head(path.read_bytes()[:512]).key == "onnx"


def test_tree_models_are_told_by_name_and_content(tmp_path):
    lightgbm = lightgbm_model(tmp_path / "m.txt").read_bytes()[:512]
    as_json = xgboost_model(tmp_path / "m.json").read_bytes()[:512]
    as_ubj = xgboost_model(tmp_path / "m.ubj").read_bytes()[:512]
    assert detect_format(lightgbm, filename="model.txt").key == "lightgbm"
    assert detect_format(lightgbm, filename="model").key == "lightgbm"
    assert detect_format(as_json, filename="booster.json").key == "xgboost"
    assert detect_format(as_ubj, filename="booster.ubj").key == "xgboost"
    assert detect_format(b' \n{"version": [3, 2, 0], "learner": {}}', filename="b.json").key == "xgboost"


@pytest.mark.parametrize(
    ("filename", "head", "says"),
    [
        # a text file under a LightGBM name is not taken for one
        ("notes.txt", b"hello, this is text\n", "This is not a LightGBM model (text): it looks like a text file"),
        # any JSON is not an XGBoost model
        ("config.json", b'{"name": "resnet"}', "This is not an XGBoost model (JSON or UBJSON): it looks like a text"),
        # content of one format under another's name: rename
        ("model.onnx", b"tree\nversion=v4\nnum_class=1\n", "its content is a LightGBM model (text). Rename it to end"),
        ("model.txt", b"\x08\x07\x12\x07pytorch", "its content is an ONNX model. Rename it to end in .onnx"),
        ("model.onnx", b"\x80\x04\x95" + b"\0" * 20, "its content is a scikit-learn model (pickle). Rename it"),
        # an archive under a model file's name, and a model file under an archive's name
        ("model.onnx", b"PK\x03\x04" + b"\0" * 100, "it looks like a ZIP archive (a zipped folder"),
        ("model.zip", b"\x08\x07\x12\x07pytorch", "its content is an ONNX model. Rename it to end in .onnx"),
        # a TensorRT plan, raw or behind an Ultralytics metadata header, named as an ONNX model
        ("model.onnx", b"ftrt" + bytes(60), "its content is a TensorRT plan. Rename it to end in .plan or .engine"),
        (
            "yolo.onnx",
            (14).to_bytes(4, "little") + b'{"task": "d"} ' + b"ftrt" + bytes(40),
            "its content is a TensorRT plan. Rename it to end in .plan",
        ),
    ],
)
def test_the_name_narrows_the_formats_and_the_content_must_be_one_of_them(filename, head, says):
    with pytest.raises(InvalidInput) as raised:
        detect_format(head, filename=filename, field="head")
    assert raised.value.field == "head" and says in raised.value.detail


@pytest.mark.parametrize(
    ("head", "says"),
    [
        (b"hello, this is text\n", "a text file"),
        (b"\x00\x01\x02\x03" * 8, "its first bytes (00 01 02 03 00 01 02 03) are none of the formats Conch builds"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 99\n", "Git LFS pointer"),
    ],
)
def test_other_first_bytes_are_refused_naming_the_format(head, says):
    with pytest.raises(InvalidInput) as raised:
        check_model_head(head, field="file")
    assert raised.value.field == "file" and says in raised.value.detail


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"PK\x03\x04" + b"\0" * 40, "zip"),
        (b"\x1f\x8b\x08" + b"\0" * 40, "tar.gz"),
        (b"BZh91AY&SY", "tar.bz2"),
        (b"\xfd7zXZ\x00\x00", "tar.xz"),
        (b"model.onnx".ljust(257, b"\0") + b"ustar\x0000", "tar"),
    ],
)
def test_archives_are_told_by_their_first_bytes(head, kind):
    assert archive_kind(head) == kind
    assert detect_format(head, filename="").key == "archive"
    assert detect_format(head, filename="bundle.zip" if kind == "zip" else f"bundle.{kind}").key == "archive"


def test_the_formats_list_names_each_format_its_backend_and_conversion():
    listed = {entry["key"]: entry for entry in describe_formats()}
    assert (
        list(listed)
        == [f.key for f in FORMATS]
        == [
            "onnx",
            "lightgbm",
            "xgboost",
            "sklearn",
            "keras",
            "tf_savedmodel",
            "tf_graphdef",
            "tflite",
            "torchscript",
            "torch_export",
            "tensorrt_plan",
            "triton_repository",
            "python",
            "archive",
        ]
    )
    assert listed["python"]["served_as"] == "python" and listed["python"]["conversion"] is None
    assert listed["archive"]["container"] is True and listed["onnx"]["container"] is False
    assert listed["sklearn"]["runs_code"] is True and listed["onnx"]["runs_code"] is False
    assert listed["onnx"]["conversion"] is None and listed["onnx"]["served_as"] == "onnxruntime"
    assert listed["lightgbm"]["conversion"] == "onnxmltools" and listed["xgboost"]["suffixes"] == [".json", ".ubj"]
    assert listed["torchscript"]["served_as"] == "pytorch" and listed["torchscript"]["conversion"] is None
    assert listed["torch_export"]["conversion"] == "torch.onnx" and listed["torch_export"]["suffixes"] == [".pt2"]


def test_a_tensorrt_plan_is_told_raw_or_behind_an_ultralytics_header():
    assert detect_format(b"ftrt" + bytes(60), filename="model.plan").key == "tensorrt_plan"
    assert detect_format(b"ftrt" + bytes(60), filename="").key == "tensorrt_plan"
    wrapped = (14).to_bytes(4, "little") + b'{"task": "d"} ' + b"ftrt" + bytes(40)
    assert detect_format(wrapped, filename="yolo11n.engine").key == "tensorrt_plan"
    with pytest.raises(InvalidInput) as raised:
        detect_format(b"\x08\x07\x12\x07pytorch", filename="model.plan")
    assert "its content is an ONNX model" in raised.value.detail


def _zip_head(member: str, data: bytes = b"") -> bytes:
    """The opening of a zip whose first member is `member`, stored, its data beginning with `data`."""
    name = member.encode()
    return b"PK\x03\x04" + b"\0" * 22 + len(name).to_bytes(2, "little") + b"\0\0" + name + data + b"\0" * 40


def test_pytorch_files_are_told_apart_by_their_first_member(tmp_path):
    from devtools import torch_models

    made = {
        "scripted": torch_models.torchscript(tmp_path / "a.pt"),
        "traced": torch_models.torchscript(tmp_path / "b.pt", traced=True),
        "program": torch_models.exported_program(tmp_path / "c.pt2"),
        "checkpoint": torch_models.checkpoint(tmp_path / "d.pt"),
    }
    heads = {key: path.read_bytes()[:HEAD_BYTES] for key, path in made.items()}
    assert detect_format(heads["scripted"], filename="m.pt").key == "torchscript"
    assert detect_format(heads["traced"], filename="m.jit").key == "torchscript"
    assert detect_format(heads["program"], filename="m.pt2").key == "torch_export"
    assert detect_format(heads["program"], filename="").key == "torch_export"
    # a module without tensors opens with its data.pkl, which names a __torch__ class
    assert detect_format(_zip_head("m/data.pkl", b"\x80\x02c__torch__\nM\n"), filename="m.pt").key == "torchscript"
    for head in (heads["checkpoint"], _zip_head("whole/data.pkl", b"\x80\x02c__main__\nNet\n")):
        with pytest.raises(InvalidInput) as raised:
            detect_format(head, filename="weights.pth")
        assert raised.value.detail.startswith("This is a PyTorch checkpoint written by torch.save")
    with pytest.raises(InvalidInput) as raised:
        detect_format(heads["program"], filename="m.pt")
    assert raised.value.detail.startswith("'m.pt' is named like a TorchScript model file, but its content is a PyTorch")


def test_tensorflow_formats_are_told_by_name_and_content():
    keras_zip = b"PK\x03\x04" + b"\0" * 26 + b"metadata.json{}"
    hdf5 = b"\x89HDF\r\n\x1a\n" + b"\0" * 40
    graph_def = b"\n;\n\x01x\x12\x0bPlaceholder*\x0b"
    tflite = b"\x1c\x00\x00\x00TFL3" + b"\0" * 40
    assert detect_format(keras_zip, filename="m.keras").key == "keras"
    assert detect_format(keras_zip, filename="").key == "keras"  # a .keras file is told from another zip
    assert detect_format(b"PK\x03\x04" + b"\0" * 26 + b"model.onnx", filename="").key == "archive"
    assert detect_format(hdf5, filename="weights.h5").key == "keras"
    assert detect_format(graph_def, filename="frozen.pb").key == "tf_graphdef"
    assert detect_format(tflite, filename="m.tflite").key == "tflite"
    # a SavedModel's saved_model.pb alone holds no weights: upload the folder
    with pytest.raises(InvalidInput) as raised:
        detect_format(b"\x08\x01\x12\xf1\xf6\x01\n", filename="saved_model.pb")
    assert raised.value.detail.startswith("This is the saved_model.pb of a TensorFlow SavedModel")
    assert "Upload the whole SavedModel folder in one zip or tar" in raised.value.detail
