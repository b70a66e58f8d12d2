"""TensorFlow Lite models (`.tflite`, a FlatBuffer with the identifier "TFL3"), converted to ONNX with tf2onnx.

Inputs and outputs are named by the model's serving signature when it has one (what TFLiteConverter writes from a
Keras model or a SavedModel: "features", "output_0"), else by their tensor names. The source outputs come from
TensorFlow's own TFLite interpreter. Sandbox child only for `convert` and `run_source`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from builds.formats._tf import (
    OPSET,
    conversion_report,
    import_tensorflow,
    name_batch_axis,
    rename_tensors,
    run_tf2onnx,
    strip_port,
)
from builds.formats._trees import tool_reason
from builds.formats.base import NO_HINTS, Conversion, ConversionHints, ModelFormat
from conch.errors import InvalidInput

__all__ = ["TFLiteFormat"]


class TFLiteFormat(ModelFormat):
    """A TensorFlow Lite model, converted with tf2onnx and served by the `onnxruntime` backend."""

    key: ClassVar[str] = "tflite"
    title: ClassVar[str] = "TensorFlow Lite model"
    suffixes: ClassVar[tuple[str, ...]] = (".tflite",)
    converter: ClassVar[str] = "tf2onnx"
    upload_hint: ClassVar[str] = "the .tflite file tf.lite.TFLiteConverter writes"

    def matches_head(self, head: bytes) -> bool:
        return head[4:8] == b"TFL3"

    def local_name(self, head: bytes) -> str:
        return "model.tflite"

    def convert(self, source: Path, target: Path, hints: ConversionHints = NO_HINTS) -> Conversion:
        import tf2onnx

        names = _signature_names(source)
        _refuse_state(source)
        started = time.monotonic()
        model, _ = run_tf2onnx(self.title, lambda: tf2onnx.convert.from_tflite(str(source), opset=OPSET))
        notes = rename_tensors(
            model,
            {
                value.name: names.get(value.name, strip_port(value.name))
                for value in (*model.graph.input, *model.graph.output)
            },
        )
        if name_batch_axis(model):
            notes.append("axis 0 of every input and output is the batch axis N (the model leaves it open)")
        target.write_bytes(model.SerializeToString())
        return conversion_report(model, started=started, notes=notes)

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        interpreter = _interpreter(source)
        names = _signature_names(source)
        by_name = {names.get(d["name"], strip_port(d["name"])): d for d in interpreter.get_input_details()}
        for name, array in inputs.items():
            interpreter.resize_tensor_input(by_name[name]["index"], list(np.shape(array)))
        interpreter.allocate_tensors()
        for name, array in inputs.items():
            interpreter.set_tensor(by_name[name]["index"], np.asarray(array, dtype=by_name[name]["dtype"]))
        interpreter.invoke()
        return {
            names.get(d["name"], strip_port(d["name"])): np.asarray(interpreter.get_tensor(d["index"]))
            for d in interpreter.get_output_details()
        }


def _interpreter(source: Path) -> Any:
    import warnings

    tf = import_tensorflow()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tf.lite.Interpreter's notice that LiteRT replaces it
            return tf.lite.Interpreter(model_path=str(source), num_threads=1)
    except Exception as error:  # ValueError for a file the interpreter cannot read
        raise InvalidInput(
            f"TensorFlow Lite cannot read this model: {tool_reason(error)}. Upload the .tflite file "
            "tf.lite.TFLiteConverter wrote, unchanged.",
            field="file",
        ) from None


#: TFLite ops that keep state between invocations (resource variables), which ONNX has no counterpart for.
_STATE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE")


def _refuse_state(source: Path) -> None:
    """Raise InvalidInput (field "file") for a model that keeps state between invocations (a streaming model's
    resource variables): tf2onnx cannot convert those, and fails with an unrelated Python error if asked to."""
    interpreter = _interpreter(source)
    ops = {str(op.get("op_name", "")) for op in interpreter._get_ops_details()}  # the interpreter's op list
    stateful = sorted(ops.intersection(_STATE_OPS))
    if stateful:
        raise InvalidInput(
            "This TensorFlow Lite model keeps state between calls (it uses the resource-variable ops "
            f"{', '.join(stateful)}, as streaming models do), and ONNX has no counterpart for that, so tf2onnx "
            "cannot convert it. Export the model without streaming state (a model that takes the whole input "
            "window in one call) and upload that .tflite, or upload its SavedModel.",
            field="file",
        )


def _signature_names(source: Path) -> dict[str, str]:
    """Tensor name -> signature key of the model's one serving signature ({} when it has none or several)."""
    interpreter = _interpreter(source)
    signatures = interpreter.get_signature_list()
    if len(signatures) != 1:
        return {}
    runner = interpreter.get_signature_runner(next(iter(signatures)))
    names: dict[str, str] = {}
    for details in (runner.get_input_details(), runner.get_output_details()):
        for key, detail in details.items():
            names[detail["name"]] = key
    return names
