"""Small ONNX models written by tests, where a behaviour is easier to see than with a trained model."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

# y = x + c lives in the development tooling (bench/reconcile.py uses it too); the tests import it from here.
from devtools.seed import add_constant as add_constant


def onnx_like(data: bytes) -> bytes:
    """`data` with its first two bytes made ONNX's opening (field 1, ir_version 7), same length (at least 2).

    The upload refuses a file whose first bytes are not an ONNX protobuf's (`builds.formats`); tests about what
    happens to an upload after that check (quotas, roles, sizes) send such bytes, which the build then fails on.
    """
    return b"\x08\x07" + data[2:]


def wrong_declared_output(path: Path) -> Path:
    """Write a model whose file declares its output's shape wrongly, as ddddocr's common.onnx does; returns `path`.

    x FP32 [1, width] -> y = x reshaped to [width / 2, 1, 2], but the file declares y FP32 [1, length] (rank 2
    declared, rank 3 produced; axis 0 follows the input's dynamic width). Not batchable: axis 0 of x is fixed at 1.
    """
    # squeeze without axes leaves the rank unknown to shape inference, so the declared (wrong) shape stands, as in
    # ddddocr's graph: x [1, w] -> [w / 2, 2, 1] -> [w / 2, 2] -> [w / 2, 1, 2]
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [-1, 2, 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("Squeeze", ["r"], ["s"]),
            helper.make_node("Unsqueeze", ["s", "axes"], ["y"]),
        ],
        "wrong_declared_output",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "length"])],
        [shape, axes],
    )
    return _save(graph, path)


def rank_follows_values(path: Path) -> Path:
    """Write a model whose output rank depends on its input's values, with a wrongly declared output; returns `path`.

    s INT64 [2] -> y FP32 = squeeze(expand(ones [1, 1], s)): s = [1, 1] gives a scalar, s = [0, 0] a [0, 0]
    tensor. The file declares y FP32 [5].
    """
    ones = helper.make_tensor("ones", TensorProto.FLOAT, [1, 1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Expand", ["ones", "s"], ["e"]), helper.make_node("Squeeze", ["e"], ["y"])],
        "rank_follows_values",
        [helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])],
        [ones],
    )
    return _save(graph, path)


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def batched_wrong_declared_output(path: Path) -> Path:
    """Write a batchable model whose file declares its output's rank wrongly; returns `path`.

    x FP32 [batch, 4] -> y = x with an axis 1 inserted, [batch, 1, 4]; the file declares y FP32 [batch, 4]. The
    axes are computed from x's dynamic batch size (batch * 0 + 1), so neither onnx's shape inference nor
    onnxruntime's constant folding (in the optimized session Triton's onnxruntime backends open) can tell the rank,
    and the declared shape stands. An axes constant, even behind an Identity, is folded by the optimized session,
    whose inferred rank then clashes with the declared one and leaves y with no shape at all.
    """
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    zero = helper.make_tensor("zero", TensorProto.INT64, [1], [0])
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["batch_size"], start=0, end=1),
            helper.make_node("Mul", ["batch_size", "zero"], ["nothing"]),
            helper.make_node("Add", ["nothing", "one"], ["axes"]),
            helper.make_node("Unsqueeze", ["x", "axes"], ["y"]),
        ],
        "batched_wrong_declared_output",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [one, zero],
    )
    return _save(graph, path)


def doubler(path: Path, shape: tuple[int | str, ...] = ("batch", 4), input_name: str = "x") -> Path:
    """Write y = 2 * x: input `input_name` FP32 of `shape` (a str is a dynamic axis), output y FP32 of the same shape;
    returns `path`. Batchable along a dynamic axis 0 (each row's outputs are its own)."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", [input_name, "two"], ["y"])],
        "doubler",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [two],
    )
    return _save(graph, path)
