"""Small ONNX models written by tests, where a behaviour is easier to see than with a trained model."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper


def add_constant(path: Path, constant: float) -> Path:
    """Write y = x + `constant` to `path`: x FP32 [batch, 4] -> y FP32 [batch, 4]; returns `path`.

    Two of them with different constants are two versions of one model whose answers tell them apart.
    """
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "add_constant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("c", TensorProto.FLOAT, [1], [constant])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def onnx_like(data: bytes) -> bytes:
    """`data` with its first two bytes made ONNX's opening (field 1, ir_version 7), same length (at least 2).

    The upload refuses a file whose first bytes are not an ONNX protobuf's (`builds.formats`); tests about what
    happens to an upload after that check (quotas, roles, sizes) send such bytes, which the build then fails on.
    """
    return b"\x08\x07" + data[2:]
