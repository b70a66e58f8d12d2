"""What the TensorFlow formats share (SavedModel, Keras, frozen GraphDef, TFLite): converting with tf2onnx, and
naming the converted model's tensors as the source names them.

Triton's TensorFlow backend is deprecated since release 25.03 and removed after it (Triton release notes, 25.03),
so every TensorFlow model is served as ONNX by the `onnxruntime` backend. tf2onnx names tensors by their graph
tensor names ("Identity:0", "serving_default_x:0"); the converted model's inputs and outputs are renamed to the
names a user knows (the serving signature's keys, the Keras layer names, the GraphDef node names), and axis 0 is
named `N` where every input and output leaves it dynamic. Sandbox child only: TensorFlow is imported in the calls.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from builds.formats._trees import onnx_opsets, package_version, tool_reason
from builds.formats.base import Conversion
from conch.errors import InvalidInput

__all__ = [
    "OPSET",
    "conversion_report",
    "import_tensorflow",
    "name_batch_axis",
    "rename_tensors",
    "run_tf2onnx",
    "strip_port",
]

#: The ONNX opset tf2onnx converts to: 17 is served by every onnxruntime Triton has shipped since 23.x.
OPSET = 17
#: The symbolic name given to axis 0 when every input and output leaves it dynamic (one row per sample).
BATCH_AXIS_NAME = "N"


def import_tensorflow() -> Any:
    """Import TensorFlow quietly (its C++ logging off) and return the module."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    return tf


def strip_port(name: str) -> str:
    """A TensorFlow tensor name without its output index: "dense/BiasAdd:0" -> "dense/BiasAdd"; "x:1" stays."""
    return name[:-2] if name.endswith(":0") else name


def run_tf2onnx(title: str, convert: Callable[[], Any]) -> Any:
    """Call `convert` (a tf2onnx call); return what it returns.

    Raises InvalidInput (field "file") with tf2onnx's reason and what to do when the model cannot be converted
    (an op tf2onnx does not support, a graph it cannot read).
    """
    import logging

    logging.getLogger("tf2onnx").setLevel(logging.ERROR)
    try:
        return convert()
    except InvalidInput:
        raise
    except Exception as error:  # tf2onnx raises ValueError/KeyError/RuntimeError and TensorFlow's own errors
        raise InvalidInput(
            f"tf2onnx could not convert this {title}: {tool_reason(error)}. If it names an operation, the model uses "
            "one that ONNX has no counterpart for: replace it with standard operations and export the model again, "
            "or convert it yourself (python -m tf2onnx.convert, with --custom-ops if your Triton has them) and "
            "upload the .onnx file.",
            field="file",
        ) from None


def rename_tensors(model: Any, names: Mapping[str, str]) -> list[str]:
    """Rename tensors of an `onnx.ModelProto` everywhere they appear (graph inputs and outputs, node inputs and
    outputs, value infos); return a note per renamed graph input or output ("output 'Identity:0' named 'probs'").

    Raises InvalidInput (field "file") when two tensors would get the same name.
    """
    wanted = {old: new for old, new in names.items() if old != new}
    if not wanted:
        return []
    taken = {value.name for value in (*model.graph.input, *model.graph.output)} - set(wanted)
    clashes = sorted(set(wanted.values()) & taken) or sorted(
        {new for new in wanted.values() if list(wanted.values()).count(new) > 1}
    )
    if clashes:
        raise InvalidInput(
            f"The converted model's tensors cannot all be named as the source names them: {clashes[0]!r} would name "
            "two tensors. Give the model's inputs and outputs distinct names and export it again.",
            field="file",
        )
    notes = []
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for value in values:
            if value.name in wanted:
                notes.append(f"{kind} {value.name!r} named {wanted[value.name]!r}")
                value.name = wanted[value.name]
    for value in model.graph.value_info:
        value.name = wanted.get(value.name, value.name)
    for node in model.graph.node:
        node.input[:] = [wanted.get(name, name) for name in node.input]
        node.output[:] = [wanted.get(name, name) for name in node.output]
    return notes


def name_batch_axis(model: Any) -> bool:
    """Name axis 0 `N` on every input and output of an `onnx.ModelProto` when all of them leave it dynamic (what
    tf2onnx writes for a TensorFlow `None` first dimension: an unnamed or "unk__…" axis); return whether it did."""
    values = [*model.graph.input, *model.graph.output]
    dims = [value.type.tensor_type.shape.dim for value in values]
    if not dims or any(not d or d[0].HasField("dim_value") for d in dims):
        return False
    for d in dims:
        d[0].dim_param = BATCH_AXIS_NAME
    return True


def conversion_report(model: Any, *, started: float, notes: list[str]) -> Conversion:
    """The `Conversion` of a tf2onnx run that began at `started` (time.monotonic())."""
    return Conversion(
        tool=package_version("tf2onnx"),
        source=f"tensorflow {import_tensorflow().__version__}",
        opset=onnx_opsets(model),
        notes=tuple(notes),
        seconds=time.monotonic() - started,
    )
