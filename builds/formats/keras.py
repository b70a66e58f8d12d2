"""Keras models (`.keras`, Keras 3's zip; `.h5`, the legacy HDF5 file), converted to ONNX with tf2onnx.

The model is loaded with `keras.saving.load_model(..., safe_mode=True)`: a Lambda layer's Python code (which a
`.keras` file can carry as bytecode) is refused, not run. The converted model's inputs are named as the model's
input layers, its outputs as its output layers (`model.output_names`). Sandbox child only for `convert` and
`run_source`.
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
)
from builds.formats._trees import tool_reason
from builds.formats.base import NO_HINTS, Conversion, ConversionHints, ModelFormat
from conch.errors import InvalidInput

__all__ = ["KerasFormat"]

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
#: The members a Keras 3 `.keras` zip begins with (keras.saving: metadata.json, config.json, model.weights.h5).
_KERAS_MEMBERS = (b"metadata.json", b"config.json", b"model.weights.h5")


class KerasFormat(ModelFormat):
    """A Keras model, `.keras` or `.h5`, converted with tf2onnx and served by the `onnxruntime` backend."""

    key: ClassVar[str] = "keras"
    title: ClassVar[str] = "Keras model"
    suffixes: ClassVar[tuple[str, ...]] = (".keras", ".h5", ".hdf5")
    converter: ClassVar[str] = "tf2onnx"
    upload_hint: ClassVar[str] = "the file model.save('model.keras') writes (or a legacy .h5)"

    def matches_head(self, head: bytes) -> bool:
        if head.startswith(_HDF5_MAGIC):
            return True
        # a zip whose first member (its name at byte 30 of the local file header) is one of Keras' own
        return head.startswith(b"PK\x03\x04") and head[30:46].startswith(_KERAS_MEMBERS)

    def local_name(self, head: bytes) -> str:
        # Keras picks its loader by the file's ending
        return "model.h5" if head.startswith(_HDF5_MAGIC) else "model.keras"

    def convert(self, source: Path, target: Path, hints: ConversionHints = NO_HINTS) -> Conversion:
        import tf2onnx

        tf = import_tensorflow()
        model = _load(source)
        inputs = [_input_name(tensor, index) for index, tensor in enumerate(model.inputs)]
        spec = [
            tf.TensorSpec((None, *tuple(tensor.shape[1:])), tensor.dtype, name=name)
            for tensor, name in zip(model.inputs, inputs, strict=True)
        ]
        started = time.monotonic()
        function = tf.function(lambda *args: _call(model, list(args)))
        converted, _ = run_tf2onnx(
            self.title, lambda: tf2onnx.convert.from_function(function, input_signature=spec, opset=OPSET)
        )
        outputs = list(getattr(model, "output_names", None) or [f"output_{i}" for i in range(len(model.outputs))])
        notes = rename_tensors(
            converted, dict(zip([value.name for value in converted.graph.output], outputs, strict=True))
        )
        if name_batch_axis(converted):
            notes.append("axis 0 of every input and output is the batch axis N (the model leaves it open)")
        target.write_bytes(converted.SerializeToString())
        return conversion_report(converted, started=started, notes=notes)

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        tf = import_tensorflow()
        model = _load(source)
        names = [_input_name(tensor, index) for index, tensor in enumerate(model.inputs)]
        results = _call(model, [tf.constant(inputs[name]) for name in names])
        results = results if isinstance(results, list | tuple) else [results]
        outputs = list(getattr(model, "output_names", None) or [f"output_{i}" for i in range(len(results))])
        return {name: np.asarray(value) for name, value in zip(outputs, results, strict=True)}


def _load(source: Path) -> Any:
    import_tensorflow()
    import keras

    try:
        return keras.saving.load_model(str(source), compile=False, safe_mode=True)
    except Exception as error:  # keras raises ValueError/TypeError/OSError for what it cannot read or refuses
        reason = tool_reason(error)
        if "safe_mode" in reason or "Lambda" in reason:
            raise InvalidInput(
                "This Keras model holds a Lambda layer, whose Python code Conch does not run: loading it would run "
                "code from the file. Replace the Lambda layer with built-in layers (or a registered custom layer "
                "exported to a SavedModel with model.export) and upload it again.",
                field="file",
            ) from None
        raise InvalidInput(
            f"Keras cannot load this model: {reason}. Upload the file model.save('model.keras') writes; a model "
            "with custom layers must be exported with model.export('folder') and uploaded as a SavedModel (zip).",
            field="file",
        ) from None


def _call(model: Any, args: list[Any]) -> Any:
    return model(args if len(args) > 1 else args[0], training=False)


def _input_name(tensor: Any, index: int) -> str:
    name = str(getattr(tensor, "name", "") or f"input_{index}")
    return name.split(":", 1)[0]
