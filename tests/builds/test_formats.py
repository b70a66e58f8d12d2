"""Which files Conch builds, from their name and first bytes (`builds.formats`): pure checks."""

from __future__ import annotations

import pytest

from builds.formats import check_model_filename, check_model_head
from conch.errors import InvalidInput
from tests import real_models


@pytest.mark.parametrize("name", ["model.onnx", "MODEL.ONNX", "rapid.v2.onnx", "model", "dir/model.onnx"])
def test_onnx_names_and_names_without_an_ending_pass(name):
    check_model_filename(name, field="filename")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("model.pt", "a PyTorch checkpoint"),
        ("pytorch_model.bin", "a weights file"),
        ("notes.txt", "rename it to end in .onnx"),
        ("model.onnx.gz", "an archive"),
        ("model.h5", "tf2onnx"),
    ],
)
def test_other_endings_are_refused_naming_the_field_and_what_conch_builds(name, says):
    with pytest.raises(InvalidInput) as raised:
        check_model_filename(name, field="filename")
    assert raised.value.field == "filename"
    assert raised.value.detail.startswith(f"{name!r} is not an ONNX model file: Conch builds ONNX models")
    assert says in raised.value.detail


def test_the_first_bytes_of_real_onnx_models_pass():
    for path in (real_models.classifier(), real_models.magika()):
        check_model_head(path.read_bytes()[:512])


@pytest.mark.parametrize(
    ("head", "says"),
    [
        (b"PK\x03\x04" + b"\0" * 100, "a ZIP archive (a zipped folder, a PyTorch .pt/.pth checkpoint"),
        (b"\x80\x04\x95" + b"\0" * 100, "a Python pickle"),
        (b"hello, this is text\n", "a text file"),
        (b"\x00\x01\x02\x03" * 8, "begins with the bytes 00 01 02 03"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 99\n", "Git LFS pointer"),
    ],
)
def test_other_first_bytes_are_refused_naming_the_format(head, says):
    with pytest.raises(InvalidInput) as raised:
        check_model_head(head, field="file")
    assert raised.value.field == "file" and says in raised.value.detail
